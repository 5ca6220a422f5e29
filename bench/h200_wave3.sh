#!/usr/bin/env bash
# The speed wave's H200 sitting (issue 21), after `source .device-wheels/b/install.sh`
# (../shared/device/README.md): `bash bench/h200_wave3.sh a` then `... b` on the same machine.
# Each bench has its own time limit; stdout and JSON land in $OUT.
set -u
export PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
O=${OUT:-/tmp/out}; mkdir -p "$O"
CK=/tmp/bench-qwen3-8b-bfloat16
run() {  # run NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "== $name ($(date +%T), limit ${secs}s)"
  timeout "$secs" "$@" > "$O/$name.txt" 2>&1; echo "   rc=$? ($(date +%T))"; tail -6 "$O/$name.txt"
  pkill -f "mlxbun_core.cli serve" 2>/dev/null; sleep 1
}
case "$1" in
  a)
    python3 -c "
import os, sys
sys.path.insert(0, 'bench')
from mlxbun_core.testing.checkpoints import write_checkpoint
from serve_concurrency import SHAPES
if not os.path.exists('$CK/config.json'):
    write_checkpoint('$CK', 'qwen3', seed=11, dtype='bfloat16', config_overrides=SHAPES['8b'])
print('checkpoint ready')"
    run kvquant_probe_h200 60 python3 -m mlxbun_core.cli serve $CK --kv-quant 8 --port 8199 --no-open
    run speculation_h200_8b 230 python3 bench/speculation.py --shape 8b --rounds 3 --max-tokens 256 --out $O/speculation_h200_8b.json
    run many_adapters_h200 200 python3 bench/many_adapters.py --shape 8b --prompt-tokens 128 --max-tokens 256 --rounds 3 --out $O/many_adapters_h200.json
    ;;
  b)
    run fill_h200 260 python3 bench/fill.py --shape 8b --model $CK --rounds 4 --out $O/fill_h200.json
    run speculation_h200_smollm2 150 python3 bench/speculation.py --rounds 3 --max-tokens 256 --out $O/speculation_h200_smollm2.json
    run fill_h200_mixed 120 env MLXBUN_FILL_BATCH_TOKENS=512 python3 bench/fill.py --shape 8b --model $CK --parts fill --lanes mixed --rounds 3 --out $O/fill_h200_mixed_512.json
    ;;
esac
