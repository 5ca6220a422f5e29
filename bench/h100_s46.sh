#!/usr/bin/env bash
# The next GPU sitting (issue 33): a) the lean decode step (engine/batch/lean.py) against
# mlx-lm's forward, d) the shipped engine against mlx_lm.server, b) two servers on one card
# and the flash check, c) 4-bit from an empty PTX cache, k) the step split as MLX's CUDA
# graphs are cut. Servers took 30-65 s to start on slow hosts, so each part fits one 600 s
# call.
# First a 10-million-step Python loop, to say what kind of host the figures came from.
# After `source .device-wheels/b/install.sh` (../shared/device/README.md), with
# PYTHONPATH=$PWD:/tmp/site: `bash bench/h100_s46.sh PART`.
RUN_TAIL=4
. "$(dirname "$0")/sitting.sh"
python3 -c "
import time; t = time.perf_counter(); s = 0
for i in range(10_000_000): s += i
print('host: a 10M-step Python loop in', round(time.perf_counter() - t, 3), 's')"
# the 8B step split at 32 rows, once per way: `splits LIMIT TOKENS [--heavy|--fuse-mlp|""]...`
splits() {
  local secs=$1 tokens=$2 how; shift 2
  for how in "$@"; do
    run "step_split${how:+_${how#--}}" "$secs" python3 bench/step_split.py --model /tmp/bench-qwen3-8b-bfloat16 --rows 32 --prompt-tokens 512 --tokens "$tokens" $how --out "$O/step_split${how:+_${how#--}}.json"
  done
}
case "${1:-}" in
  a)
    # (about 9 minutes) a decode step's host split with the lean graph and without, then
    # bf16 at 32 clients: the lean step against mlx-lm's forward (heavy), 2 rounds
    ckpt 0
    splits 100 64 "" --heavy
    run ab_lean ${AB_LIMIT:-330} python3 bench/engine_ab.py --shape 8b --arms paged heavy --baseline heavy --concurrency 32 --history-tokens 0 --rounds ${ROUNDS:-2} --out $O/engine_ab_lean.json
    summary $O/engine_ab_lean.json
    ;;
  e)
    # (about 9 minutes) the host split three ways (lean, lean with gate and up fused, heavy),
    # then bf16 at 1 and 32 clients: lean (batch and lone stream), heavy and mlx_lm.server
    ckpt 0
    splits 100 64 "" --fuse-mlp --heavy
    run ab_three ${AB_LIMIT:-300} python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms paged heavy mlx-lm --baseline mlx-lm --concurrency 1 32 --history-tokens 0 --rounds ${ROUNDS:-2} --out $O/engine_ab_three.json
    summary $O/engine_ab_three.json
    ;;
  g)
    # (a short lease) e's step split three ways, then one round of its serving
    ckpt 0
    splits 90 48 "" --heavy --fuse-mlp
    run ab_three ${AB_LIMIT:-200} python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms paged heavy mlx-lm --baseline mlx-lm --concurrency 1 32 --history-tokens 0 --rounds 1 --out $O/engine_ab_three.json
    summary $O/engine_ab_three.json
    ;;
  h)
    # (the shortest lease) the decode step's three ways in one process, 5 rounds, at 32
    # rows and alone (what a server's start-up times, longer); then the step split
    ckpt 0
    run decode_ways 150 python3 bench/decode_ways.py --model /tmp/bench-qwen3-8b-bfloat16 --rows 32 --prompt-tokens 512 --rounds 5 --steps 16 --out "$O/decode_ways.json"
    splits 60 24 "" --heavy
    ;;
  k)
    # (about 5 minutes) the lean step split as MLX's CUDA graphs are cut: a graph is
    # committed (updated or instantiated, then launched) every 100 kernels or ~1,000 M
    # input elements on an H100 (mlx/backend/cuda/device.cpp), 8-15 commits an 8B step
    ckpt 0
    for cut in 100:1000 400:8000 2000:200000; do
      run "step_split_ops${cut%%:*}" 60 env MLX_MAX_OPS_PER_BUFFER=${cut%%:*} MLX_MAX_MB_PER_BUFFER=${cut##*:} python3 bench/step_split.py --model /tmp/bench-qwen3-8b-bfloat16 --rows 32 --prompt-tokens 512 --tokens 24 --out "$O/step_split_ops${cut%%:*}.json"
    done
    ;;
  f)
    # (up to 9.5 minutes) e's arms again (or ARMS: "paged fused mlx-lm"), more rounds
    ckpt 0
    run ab_three_more ${AB_LIMIT:-540} python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms ${ARMS:-paged heavy mlx-lm} --baseline mlx-lm --concurrency 1 32 --history-tokens 0 --rounds ${ROUNDS:-4} --out $O/engine_ab_three_more.json
    summary $O/engine_ab_three_more.json
    ;;
  d)
    # (about 9 minutes) the shipped engine against mlx_lm.server at 32 clients, 3 rounds
    ckpt 0
    run ab_bf16 ${AB_LIMIT:-500} python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms paged mlx-lm --baseline mlx-lm --concurrency 32 --history-tokens 0 --rounds ${ROUNDS:-3} --out $O/engine_ab_bf16.json
    summary $O/engine_ab_bf16.json
    ;;
  b)
    # (about 7 minutes) two servers on one card; the flash kernel's check
    run two_servers 300 python3 bench/memory_pressure.py --two-servers --clients 16 --trials 2 --out $O/two_servers.json
    run check_flash 150 env CUDA_LAUNCH_BLOCKING=1 python3 bench/paged_kernel.py --flash --check-only --out $O/kernel_check_flash.json
    ;;
  c)
    # (about 7 minutes) 4-bit with the PTX cache in the servers' own (temporary) homes
    unset MLX_PTX_CACHE_DIR
    ckpt 4
    run ab_q4 420 python3 bench/engine_ab.py --shape 8b --bits 4 --arms paged --concurrency 32 --history-tokens 0 --rounds 2 --out $O/engine_ab_q4.json
    summary $O/engine_ab_q4.json
    ;;
esac
cp /tmp/engine_ab_*.log "$O"/ 2>/dev/null
true
