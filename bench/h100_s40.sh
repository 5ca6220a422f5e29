#!/usr/bin/env bash
# One GPU sitting for the engine's kernel, quantized batching and memory pressure (issues
# 33, 34): `bash bench/h100_s40.sh PART` after `source .device-wheels/b/install.sh`
# (../shared/device/README.md). Each bench has its own time limit; results land in $OUT.
set -u
export PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
O=${OUT:-/tmp/out}; mkdir -p "$O"
run() {  # run NAME SECONDS CMD...: stdout+stderr to NAME.txt
  local name=$1 secs=$2; shift 2
  echo "== $name ($(date +%T), limit ${secs}s)"
  timeout "$secs" "$@" > "$O/$name.txt" 2>&1; echo "   rc=$? ($(date +%T))"; tail -5 "$O/$name.txt"
  pkill -f "mlxbun_core.cli" 2>/dev/null; pkill -f "mlx_lm.server" 2>/dev/null; sleep 1
}
ckpts() {
  python3 -c "
import sys; sys.path.insert(0, 'bench')
from engine_ab import checkpoint
print(checkpoint('8b', 0)); print(checkpoint('8b', 4))"
}
case "$1" in
  a)
    run kernel 90 python3 bench/paged_kernel.py --out $O/paged_kernel.json
    run qmm 100 python3 bench/quant_matmul.py --rounds 3 --calls 10 --out $O/quant_matmul.json
    run ckpt 240 ckpts
    ;;
  b)
    run step_bf16 170 python3 bench/batch_step.py --model /tmp/bench-qwen3-8b-bfloat16 --rows 8 32 --prompt-tokens 512 --tokens 64 --rounds 3 --direct --out $O/batch_step_bf16.json
    run step_q4 220 python3 bench/batch_step.py --model /tmp/bench-qwen3-8b-bfloat16-q4 --rows 8 32 --prompt-tokens 512 --tokens 64 --rounds 2 --direct --unpack --out $O/batch_step_q4.json
    run pressure 200 python3 bench/memory_pressure.py --trials 3 --out $O/memory_pressure.json
    ;;
  c)
    run ab_bf16 290 python3 bench/engine_ab.py --shape 8b --with-mlx-lm --arms paged mlx-lm --concurrency 8 32 --rounds 1 --out $O/engine_ab_bf16.json
    run ab_q4 290 python3 bench/engine_ab.py --shape 8b --bits 4 --with-mlx-lm --arms paged mlx-lm --concurrency 8 32 --history-tokens 0 --rounds 1 --out $O/engine_ab_q4.json
    ;;
esac
