#!/usr/bin/env bash
# The third GPU sitting of 2026-12-07 (issues 33, 34): why the flash kernel gives NaN, and
# which kernels a fresh server compiles after it said ready (bf16, then 4-bit with the
# step trace: the 41-s stall of the 4-bit 32-client run). After
# `source .device-wheels/b/install.sh` (../shared/device/README.md): `bash bench/h100_s42.sh PART`.
RUN_TAIL=4
. "$(dirname "$0")/sitting.sh"
case "${1:-}" in
  a)
    run flash_debug 150 python3 bench/flash_debug.py --out $O/flash_debug.json
    grep -h '"variant"' $O/flash_debug.txt | python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l); print(r['variant'], r['single'], r['vecload'], r['case'][:14], r.get('max_err'), r.get('acc', {}).get('bad'), r.get('m', {}).get('bad'), r.get('m_row0'), r.get('error', '')[:80])"
    run ckpt 240 python3 -c "
import sys; sys.path.insert(0, 'bench')
from engine_ab import checkpoint
print(checkpoint('8b', 0)); print(checkpoint('8b', 4))"
    ;;
  b)
    run first_use_bf16 200 python3 bench/first_use_kernels.py --shape 8b --out $O/first_use_bf16.json
    run first_use_q4 240 env MLXBUN_P2R_TRACE=1 python3 bench/first_use_kernels.py --shape 8b --bits 4 --out $O/first_use_q4.json
    ;;
esac
cp /tmp/first_use_*.log "$O"/ 2>/dev/null
true
