#!/usr/bin/env bash
# One GPU sitting for the engine's kernel, quantized batching and memory pressure (issues
# 33, 34; s40's sitting again after its memory fixes, and two servers on one card):
# `bash bench/h100_s41.sh PART` after `source .device-wheels/b/install.sh`
# (../shared/device/README.md). Each bench has its own time limit; results land in $OUT.
. "$(dirname "$0")/sitting.sh"
LOADS=$(cat /tmp/paged_loads 2>/dev/null)  # "" (vector loads), --scalar-loads, or "gather"
[ "$LOADS" = "--scalar-loads" ] && export PAGED_VECLOAD=0
ARM=paged; [ "$LOADS" = "gather" ] && ARM=gather
case "${1:-}" in
  a)
    # the default (split-key) kernel, the flash kernel under compute-sanitizer, checkpoints
    run check_splitk 90 env CUDA_LAUNCH_BLOCKING=1 python3 bench/paged_kernel.py --check-only --out $O/kernel_check_splitk.json
    run check_flash 120 env PATH=$PATH:/usr/local/cuda/bin compute-sanitizer --print-limit 5 python3 bench/paged_kernel.py --flash --check-only --out $O/kernel_check_flash.json
    if grep -q "kernel check: ok" $O/check_splitk.txt; then echo "" > /tmp/paged_loads; else echo gather > /tmp/paged_loads; fi
    echo "loads: '$(cat /tmp/paged_loads)'"
    run ckpt 240 python3 -c "
import sys; sys.path.insert(0, 'bench')
from engine_ab import checkpoint
print(checkpoint('8b', 0)); print(checkpoint('8b', 4))"
    ;;
  b)
    # the flash arm too where its check passed under compute-sanitizer (part a)
    FLASH=""; grep -q "kernel check: ok" $O/check_flash.txt 2>/dev/null && [ "$ARM" = paged ] && FLASH=flash
    run ab_bf16 420 python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms $ARM $FLASH mlx-lm --baseline mlx-lm --concurrency 8 32 --rounds 1 --out $O/engine_ab_bf16.json
    ;;
  c)
    run ab_q4 240 python3 bench/engine_ab.py --shape 8b --bits 4 --with-mlx-lm --arms $ARM mlx-lm --baseline mlx-lm --concurrency 32 --history-tokens 0 --rounds 1 --out $O/engine_ab_q4.json
    run pressure 200 python3 bench/memory_pressure.py --trials 2 --out $O/memory_pressure.json
    ;;
  d)
    run two_servers 300 python3 bench/memory_pressure.py --two-servers --clients 16 --trials 2 --out $O/two_servers.json
    [ "$LOADS" != gather ] && run kernel_speed 90 python3 bench/paged_kernel.py --out $O/paged_kernel.json
    grep -q "kernel check: ok" $O/check_flash.txt 2>/dev/null && run kernel_speed_flash 90 python3 bench/paged_kernel.py --flash --out $O/paged_kernel_flash.json
    ;;
  e)
    [ "$LOADS" = gather ] && L="" || L="--direct $LOADS"
    run step_bf16 200 python3 bench/batch_step.py --model /tmp/bench-qwen3-8b-bfloat16 --rows 8 32 --prompt-tokens 512 --tokens 64 --rounds 2 $L --out $O/batch_step_bf16.json
    grep -q "kernel check: ok" $O/check_flash.txt 2>/dev/null && [ -n "$L" ] && run step_bf16_flash 200 python3 bench/batch_step.py --model /tmp/bench-qwen3-8b-bfloat16 --rows 8 32 --prompt-tokens 512 --tokens 64 --rounds 2 $L --flash --out $O/batch_step_bf16_flash.json
    ;;
  g)
    # where an 8-client load's first tokens go: one traced run of our arm ([p2r] records in
    # the server log: admission wait, prefill chunks with their rows, token zero's stages)
    run trace_c8 150 env MLXBUN_P2R_TRACE=1 python3 bench/engine_ab.py --shape 8b --arms $ARM --concurrency 8 --history-tokens 0 --rounds 1 --out $O/trace_c8.json
    ;;
esac
cp /tmp/engine_ab_*.log /tmp/out/*.log "$O"/ 2>/dev/null
# f: one short check of the memory reading at 32 clients (bf16), MEMLOG on; call it on a
# fresh machine after part a's staging: installs, writes the bf16 checkpoint, runs
# (`f gather`: the gathered path, whose 32-row run read ~60 GB as gone on 2026-12-07)
if [ "${1:-}" = f ]; then
  pip install -q --upgrade --no-index --no-deps --no-build-isolation --target /tmp/site . >/dev/null 2>&1
  run ckpt_bf16 90 python3 -c "
import sys; sys.path.insert(0, 'bench')
from engine_ab import checkpoint
print(checkpoint('8b', 0))"
  run ab32 120 python3 bench/engine_ab.py --shape 8b --arms ${2:-paged} --concurrency 32 --history-tokens 0 --rounds 1 --out $O/ab32.json
  grep -E "preempt|memory short|given|out of memory|direct|idle" $O/engine_ab_paged.log | head -20
  grep "\[mem\]" $O/engine_ab_paged.log | awk 'NR%3==1' | head -40
fi
