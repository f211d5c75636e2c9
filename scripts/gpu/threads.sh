#!/usr/bin/env bash
# Where the server's CPU goes under load: start it (configs/gpu.yaml + overrides), run LEVEL
# callers, and meanwhile sample every thread of the server's process tree with top (-H).
# Usage: bash scripts/gpu/threads.sh LEVEL [--set ...]
set -uo pipefail
level=$1; shift
source scripts/gpu/env.sh
python3 -m voicert serve --config configs/gpu.yaml --set server.port=8770 --set server.host=127.0.0.1 \
  --set server.max_sessions=1024 --set server.max_connections=1024 "$@" > $OUT/threads-server.log 2>&1 &
pid=$!
until grep -q 'voicert.server.app: ready$' $OUT/threads-server.log; do sleep 1; kill -0 $pid || exit 1; done
timeout 60 python3 -m loadgen --url ws://127.0.0.1:8770/v1/stream --callers "$level" --duration 20 --ramp 3 \
  --procs 4 --server-pid $pid --out $OUT/threads-lg > $OUT/threads-lg.log 2>&1 &
sleep 14
pids=$(pgrep -P $pid | tr '\n' ,)$pid
ps -o pid,pcpu,nlwp,comm -p "$pids"
top -H -b -n 2 -d 3 -p "$pids" | awk '/^top -/{n++} n==2' | head -45
wait %2 2>/dev/null
grep -E "server_cores|^\| $level \|" $OUT/threads-lg/report.md | head -3
kill -INT $pid; wait $pid
