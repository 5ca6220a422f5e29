#!/usr/bin/env bash
# The next GPU sitting (issues 33, 34), what the sixth of 2026-12-07 could not run: the
# split-key kernel's settings timed within a 36-layer graph (and each checked against the
# reference), two servers on one card after a device fault met while memory is freed
# became a lost device (and the traceback change that met it was reverted), bf16 against
# mlx_lm.server over five rounds, the flash check with its float64 reference, and a fresh
# 4-bit start with the PTX cache in mlxbun's home. After `source .device-wheels/b/install.sh`
# (../shared/device/README.md): `bash bench/h100_s45.sh PART`.
RUN_TAIL=4
. "$(dirname "$0")/sitting.sh"
case "${1:-}" in
  a)
    # (about 5 minutes)
    run kernel_sweep 270 python3 bench/paged_kernel.py --sweep --out $O/kernel_sweep.json
    cp $O/kernel_sweep.json /tmp/kernel_sweep.json 2>/dev/null  # for part d on this machine
    python3 bench/sweep_best.py /tmp/kernel_sweep.json
    if [ -n "${SWEEP_ONLY:-}" ]; then ckpt 0; exit 0; fi
    run two_servers 240 python3 bench/memory_pressure.py --two-servers --clients 16 --trials 2 --out $O/two_servers.json
    ;;
  b)
    # (about 8 minutes)
    ckpt 0
    run ab_bf16 480 python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms paged mlx-lm --baseline mlx-lm --concurrency 8 32 --history-tokens 0 --rounds 5 --out $O/engine_ab_bf16.json
    summary $O/engine_ab_bf16.json
    ;;
  c)
    # (about 6 minutes) the PTX cache in the servers' own (temporary) home: round 1's
    # server compiles every kernel into it, round 2's finds them; the flash check
    unset MLX_PTX_CACHE_DIR
    ckpt 4
    run ab_q4 420 python3 bench/engine_ab.py --shape 8b --bits 4 --arms paged --concurrency 32 --history-tokens 0 --rounds 2 --out $O/engine_ab_q4.json
    summary $O/engine_ab_q4.json
    run check_flash 150 env CUDA_LAUNCH_BLOCKING=1 python3 bench/paged_kernel.py --flash --check-only --out $O/kernel_check_flash.json
    ;;
  d)
    # (about 9 minutes) the sweep's best setting served, against today's and mlx_lm.server,
    # 32 clients: SETTING is the split-key kernel's module settings, e.g.
    # SETTING=CHUNK=128,WARPS=8,GROUP=4,VEC=1; unset: the best of part a's sweep on this machine
    SETTING=${SETTING:-$(python3 bench/sweep_best.py /tmp/kernel_sweep.json)}
    echo "setting: $SETTING"
    ckpt 0
    run ab_setting 560 python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms paged "paged@${SETTING:?}" mlx-lm --baseline mlx-lm --concurrency 32 --history-tokens 0 --rounds ${ROUNDS:-5} --out $O/engine_ab_setting.json
    summary $O/engine_ab_setting.json
    ;;
  e)
    # (about 4 minutes) the shipped kernel setting: where a decode step's host time goes
    # (graph build, kernel encoding, waiting for the device), then 32 clients against
    # mlx_lm.server
    ckpt 0
    run step_split 120 python3 bench/step_split.py --model /tmp/bench-qwen3-8b-bfloat16 --rows 32 --prompt-tokens 512 --tokens 64 --out $O/step_split.json
    run ab_c32 ${AB_LIMIT:-200} python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms paged mlx-lm --baseline mlx-lm --concurrency 32 --history-tokens 0 --rounds ${ROUNDS:-2} --out $O/engine_ab_c32.json
    summary $O/engine_ab_c32.json
    ;;
esac
cp /tmp/engine_ab_*.log "$O"/ 2>/dev/null
true
