#!/usr/bin/env bash
# The sixth GPU sitting of 2026-12-07 (issues 33, 34): the pressure trials again
# after a persistent out-of-memory with memory reading short became a 503 (not a lost
# device), bf16 against mlx_lm.server over five rounds at 8 and 32 clients, and the
# flash kernel's check and speed after its width-4 fix, then where a served step's host
# time goes. After `source .device-wheels/b/install.sh` (../shared/device/README.md):
# `bash bench/h100_s44.sh PART`.
RUN_TAIL=4
. "$(dirname "$0")/sitting.sh"
case "${1:-}" in
  a)
    run pressure 330 python3 bench/memory_pressure.py --trials 5 --out $O/memory_pressure.json
    run two_servers 200 python3 bench/memory_pressure.py --two-servers --clients 16 --trials 1 --out $O/two_servers.json
    ;;
  s)
    # the short lease after part a: two servers again (a device fault met while memory is
    # freed ends the engine now), the split-key kernel's settings within a 36-layer graph
    # (and the flash kernel's speed), bf16 over three rounds
    run kernel_sweep 150 python3 bench/paged_kernel.py --sweep --out $O/kernel_sweep.json
    run two_servers 200 python3 bench/memory_pressure.py --two-servers --clients 16 --trials 2 --out $O/two_servers.json
    ckpt 0
    run ab_bf16 300 python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms paged mlx-lm --baseline mlx-lm --concurrency 8 32 --history-tokens 0 --rounds 3 --out $O/engine_ab_bf16.json
    summary $O/engine_ab_bf16.json
    ;;
  b)
    ckpt 0
    run ab_bf16 480 python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms paged mlx-lm --baseline mlx-lm --concurrency 8 32 --history-tokens 0 --rounds 5 --out $O/engine_ab_bf16.json
    summary $O/engine_ab_bf16.json
    ;;
  c)
    # (the check judges each kernel against a float64 host reference, the split-key
    # kernel beside the flash one as a control; flash_nonfinite says whose a NaN is)
    run check_flash 150 env CUDA_LAUNCH_BLOCKING=1 python3 bench/paged_kernel.py --flash --check-only --out $O/kernel_check_flash.json
    run kernel_speed_splitk 120 python3 bench/paged_kernel.py --out $O/paged_kernel_splitk.json
    grep -q "kernel check: ok" $O/check_flash.txt 2>/dev/null && run kernel_speed_flash 120 python3 bench/paged_kernel.py --flash --out $O/paged_kernel_flash.json
    run host_overhead 240 python3 bench/host_overhead.py --model /tmp/bench-qwen3-8b-bfloat16 --arms bare,served --prompt-tokens 512 --tokens 64 --rounds 2 --served-budget 32 --profile 10 --profile-out $O/host_profile --out $O/host_overhead_gpu.json
    ;;
  t)
    # what a lease of about three minutes allows: two servers once, then the kernel sweep
    run two_servers 150 python3 bench/memory_pressure.py --two-servers --clients 16 --trials 1 --out $O/two_servers.json
    run kernel_sweep 120 python3 bench/paged_kernel.py --sweep --out $O/kernel_sweep.json
    ;;
esac
cp /tmp/engine_ab_*.log "$O"/ 2>/dev/null
true
