#!/usr/bin/env bash
# One load sweep on this GPU machine: start the server with configs/gpu.yaml plus the given --set
# overrides, wait until /readyz, run the load generator's sweep over real speech (tests/data/*.wav),
# stop the server. Results (report.md, result.json, server.log) go to $OUT/sweep-LABEL.
# Usage: scripts/gpu/sweep.sh LABEL LEVELS [--set section.key=value ...]
#   env: DURATION (s per level, default 30), RAMP (s, default 5), PORT (default 8765),
#        PROCS (load generator processes, default 4: one falls behind real time past ~64 sessions),
#        WORKERS (default 1: with --set server.workers=N, say N: wait until every worker is ready),
#        SPEAK (set: callers ask for spoken replies, so first-audio figures are measured),
#        SWEEP_LIMIT (s, default 3000: then the load generator is stopped with every thread's stack
#        in loadgen.log; report.md holds the levels done so far)
set -euo pipefail
label=$1; levels=$2; shift 2
out=${OUT:-artifacts}/sweep-$label; mkdir -p "$out"
port=${PORT:-8765}
python3 -m voicert serve --config configs/gpu.yaml --set server.port="$port" \
  --set server.host=127.0.0.1 "$@" > "$out/server.log" 2>&1 &
pid=$!
trap 'kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
t0=$(date +%s)
until python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/readyz', timeout=2)" 2>/dev/null; do
  kill -0 $pid 2>/dev/null || { echo "server died:"; tail -30 "$out/server.log"; exit 1; }
  sleep 1
done
until [ "$(grep -c 'voicert.server.app: ready$' "$out/server.log")" -ge "${WORKERS:-1}" ]; do
  kill -0 $pid 2>/dev/null || { echo "server died:"; tail -30 "$out/server.log"; exit 1; }
  sleep 1
done
echo "[$label] server ready after $(( $(date +%s) - t0 )) s"
PYTHONFAULTHANDLER=1 timeout -s ABRT "${SWEEP_LIMIT:-3000}" python3 -m loadgen --url "ws://127.0.0.1:$port/v1/stream" --sweep "$levels" \
  --duration "${DURATION:-30}" --ramp "${RAMP:-5}" --turns 3 --think 1.0 --turn-timeout 30 \
  --procs "${PROCS:-4}" --server-pid $pid ${SPEAK:+--speak} \
  --out "$out" --title "$label" > "$out/loadgen.log" 2>&1 || { tail -30 "$out/loadgen.log"; exit 1; }
cat "$out/report.md"
