#!/usr/bin/env bash
# One H200 sitting for the wave's benchmarks: `bash bench/h200_session.sh PART` after
# `source .device-wheels/b/install.sh` (see ../shared/device/README.md). Each bench gets a
# time limit so one overrun never costs the others; results land in $OUT/r, tarred.
set -u
export PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
R=${OUT:-/tmp/out}/r; mkdir -p "$R"
CK=/tmp/bench-qwen3-8b-bfloat16
run() {  # run NAME SECONDS CMD...: stdout+stderr to NAME.txt
  local name=$1 secs=$2; shift 2
  echo "== $name ($(date +%T), limit ${secs}s)"
  timeout "$secs" "$@" > "$R/$name.txt" 2>&1; echo "   rc=$? ($(date +%T))"; tail -4 "$R/$name.txt"
  pkill -f "mlxbun_core.cli serve" 2>/dev/null; pkill -f "mlx_lm.server" 2>/dev/null; sleep 1
}
python3 -c "
import os
from mlxbun_core.testing.checkpoints import write_checkpoint
import sys; sys.path.insert(0, 'bench')
from serve_concurrency import SHAPES
if not os.path.exists('$CK/config.json'):
    write_checkpoint('$CK', 'qwen3', seed=11, dtype='bfloat16', config_overrides=SHAPES['8b'])
print('checkpoint ready')"
case "$1" in
  a)
    run grammar_cost_h200 100 python3 bench/grammar_cost.py --model $CK --tokens 256 --rounds 3 --out $R/grammar_cost_h200.json
    run kv_quant_h200 170 python3 bench/kv_quant.py --model $CK --contexts 4096 32768 --tokens 128 --rounds 2 --rows 8 --batch-context 4096 --budget-gb 16 20 24 --out $R/kv_quant_h200.json
    run agent_session_h200 230 python3 bench/agent_session.py --shape 8b --model $CK --restore-tokens 0 --out $R/agent_session_h200.json
    ;;
  b)
    run agent_restore_h200 240 python3 bench/agent_session.py --shape 8b --model $CK --arms --restore-tokens 24000 --out $R/agent_restore_h200.json
    run batch_default_h200 190 python3 bench/batch_default.py --shape 8b --model $CK --clients 32 --pin 8 32 --with-mlx-lm --rounds 1 --out $R/batch_default_h200.json
    run prefix_stall_h200 200 python3 bench/prefix_stall.py --shape 8b --bits 4 --rounds 1 --concurrency 8 32 --chats 2 --out $R/prefix_stall_h200.json
    ;;
esac
tar czf ${OUT:-/tmp/out}/results_$1.tgz -C "$R" . && rm -rf "$R"
