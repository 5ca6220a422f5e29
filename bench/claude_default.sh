#!/usr/bin/env bash
# `claude -p "say hi"` against the embedded default, as `make serve` serves it (nothing named:
# SmolLM2-135M-Instruct, its window stretched to 32,768), with --ssd-cache: cold (Claude Code's
# whole prompt read), warm (the same server: the prefix cache), then after a restart (the SSD
# tier). Wall time of each `claude -p`, and /stats after the last. Needs the npm clients
# (`make test` installs them into .npm-clients/).
#   bash bench/claude_default.sh [OUT_DIR]
set -u
OUT=${1:-/tmp/claude-default-bench}; mkdir -p "$OUT"
PORT=${PORT:-18977}
CLAUDE=${CLAUDE:-$(pwd)/.npm-clients/node_modules/.bin/claude}
PY=${PY:-python}
SSD="$OUT/ssd"
serve() {
  $PY -m mlxbun_core.cli serve --port "$PORT" --no-open --ssd-cache "$SSD" >> "$OUT/serve.log" 2>&1 &
  echo $! > "$OUT/serve.pid"
  local t0=$(date +%s.%N)
  until curl -sf "localhost:$PORT/health" > /dev/null; do sleep 0.5; done
  echo "$1 $(echo "$(date +%s.%N) - $t0" | bc) s" | tee -a "$OUT/times.txt"
}
ask() {  # one Claude Code home and one working directory (not a git checkout) for every
  # run: the home's memory paths, the directory and its git status are in the prompt, ~1k
  # tokens in, so a new home, or a commit between runs, would make every run cold
  local home="$OUT/home" work="$OUT/work"; mkdir -p "$home" "$work"; cd "$work"
  local t0=$(date +%s.%N)
  env -i PATH="$PATH" HOME="$home" ANTHROPIC_BASE_URL="http://127.0.0.1:$PORT" \
    ANTHROPIC_AUTH_TOKEN=x DISABLE_AUTOUPDATER=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
    API_TIMEOUT_MS=3600000 CLAUDE_STREAM_IDLE_TIMEOUT_MS=3600000 CLAUDE_CODE_MAX_OUTPUT_TOKENS=256 \
    ANTHROPIC_MODEL=SmolLM2-135M-Instruct ANTHROPIC_SMALL_FAST_MODEL=SmolLM2-135M-Instruct \
    "$CLAUDE" -p "say hi" --output-format json --max-turns 1 > "$OUT/$1.json" 2> "$OUT/$1.err"
  echo "$1 $(echo "$(date +%s.%N) - $t0" | bc) s rc=$?" | tee -a "$OUT/times.txt"
  cd - > /dev/null
}
stop() { kill -TERM "$(cat "$OUT/serve.pid")"; wait "$(cat "$OUT/serve.pid")" 2> /dev/null; }
serve start
ask cold
ask warm
stop
serve restart
ask restored
curl -s "localhost:$PORT/stats" > "$OUT/stats.json"
stop
grep -h '"result"' "$OUT"/*.json | head -3
