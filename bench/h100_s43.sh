#!/usr/bin/env bash
# The last GPU sitting of 2026-12-07 (issues 33, 34): bf16 at 32 clients against
# mlx_lm.server with the host work per step cut, the flash kernel's check after its
# aliasing fix, then 4-bit at 32 clients with the quantized matmuls warmed
# (MLX_ARM=mlx-lm adds mlx_lm.server's arm where device time allows). After
# `source .device-wheels/b/install.sh` (../shared/device/README.md): `bash bench/h100_s43.sh PART`.
RUN_TAIL=4
. "$(dirname "$0")/sitting.sh"
case "${1:-}" in
  a)
    ckpt 0
    run ab_bf16 200 python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms paged mlx-lm --baseline mlx-lm --concurrency 32 --history-tokens 0 --rounds 1 --out $O/engine_ab_bf16.json
    summary $O/engine_ab_bf16.json
    run check_flash 120 env CUDA_LAUNCH_BLOCKING=1 python3 bench/paged_kernel.py --flash --check-only --out $O/kernel_check_flash.json
    ;;
  b)
    ckpt 4
    run ab_q4 420 python3 bench/engine_ab.py --shape 8b --bits 4 ${MLX_ARM:+--with-mlx-lm --baseline mlx-lm} --arms paged ${MLX_ARM:-} --concurrency 32 --history-tokens 0 --rounds 1 --out $O/engine_ab_q4.json
    summary $O/engine_ab_q4.json
    grep -q "kernel check: ok" $O/check_flash.txt 2>/dev/null && run kernel_speed_flash 60 python3 bench/paged_kernel.py --flash --out $O/paged_kernel_flash.json
    ;;
  c)
    # what a short lease allows: the flash kernel's check, and whether a fresh 4-bit server
    # still compiles a quantized matmul after it said ready (a small body: MLX names the
    # kernel by dtype, tile, bits and group, not by shape)
    run check_flash 120 env CUDA_LAUNCH_BLOCKING=1 python3 bench/paged_kernel.py --flash --check-only --out $O/kernel_check_flash.json
    run first_use_q4 120 python3 bench/first_use_kernels.py --shape small --bits 4 --out $O/first_use_q4_small.json
    ;;
  d)
    # where a served step's host time goes on the GPU (py-spy from .device-wheels/b): the
    # bare batch against the server, 32 rows of the 8B body, then one profiled served run
    # and a second chat turn over a 4k history, traced ([p2r] in the log: prompt
    # preparation, the prefix restore, the new tokens' chunk; 0.13-0.18 s against 0.09-0.12)
    run trace_turn 150 env MLXBUN_P2R_TRACE=1 python3 bench/engine_ab.py --shape 8b --arms paged --concurrency 1 --history-tokens 4096 --rounds 1 --out $O/trace_turn.json
    run host_overhead 240 python3 bench/host_overhead.py --model /tmp/bench-qwen3-8b-bfloat16 --arms bare,served --prompt-tokens 512 --tokens 64 --rounds 2 --served-budget 32 --profile 10 --profile-out $O/host_profile --out $O/host_overhead_gpu.json
    ;;
  e)
    # issue 34's five pressure trials in a row (another process takes all but ~8 GB after
    # start, 32 clients), then two servers on one card under load
    run pressure 330 python3 bench/memory_pressure.py --trials 5 --out $O/memory_pressure.json
    run two_servers 200 python3 bench/memory_pressure.py --two-servers --clients 16 --trials 1 --out $O/two_servers.json
    ;;
esac
cp /tmp/engine_ab_*.log "$O"/ 2>/dev/null
true
