# Sourced by the GPU sitting scripts (bench/h100_s*.sh): the environment every bench of a
# sitting runs in, where results go ($O), and `run NAME SECONDS CMD...`: one bench under
# its time limit, stdout and stderr to $O/NAME.txt, its tail shown, servers stopped after.
set -u
export PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
# the benches' servers live in temporary homes (bench_home.py): one PTX cache for them all,
# or each would compile every kernel again (unset it after sourcing for each server's own)
export MLX_PTX_CACHE_DIR=${MLX_PTX_CACHE_DIR-/tmp/mlx-ptx-bench}
export MEMLOG=${MEMLOG:-1}  # the servers log MLX's memory each second (bench/mem_log.py)
O=${OUT:-/tmp/out}; mkdir -p "$O"
run() {
  local name=$1 secs=$2; shift 2
  echo "== $name ($(date +%T), limit ${secs}s)"
  timeout "$secs" "$@" > "$O/$name.txt" 2>&1; echo "   rc=$? ($(date +%T))"
  tail -"${RUN_TAIL:-5}" "$O/$name.txt"
  pkill -f "mlxbun_core.cli" 2>/dev/null; pkill -f "mlx_lm.server" 2>/dev/null; sleep 1
}
# the 8B body's checkpoint (BITS 0: bf16, 4: 4-bit), built once per machine
ckpt() {
  run "ckpt$([ "$1" = 0 ] || echo "_q$1")" 90 python3 -c "
import sys; sys.path.insert(0, 'bench')
from engine_ab import checkpoint
print(checkpoint('8b', $1))"
}
# an engine_ab result's summary, one line
summary() { python3 -c "
import json, sys
d = json.load(open(sys.argv[1])); print(json.dumps(d['summary']))" "$1" 2>/dev/null; }
