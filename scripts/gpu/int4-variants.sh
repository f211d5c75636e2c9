#!/usr/bin/env bash
# INT4 switches timed side by side in one command: bench.engine (--int4) on this tree as
# committed and on copies with kernels.INT4_GEMV_PERSISTENT and / or INT4_PLANES_FUSED
# switched on, or INT4_GEMV_ROWS at 4 ("rows"), round-robin (docs/benchmarks.md 64).
#   ROUNDS=2 bash scripts/gpu/int4-variants.sh "8b 1b"     outputs under $OUT (or ./variants-out)
#   VARIANTS="off rows" STREAMS=2,4 ROUNDS=2 bash scripts/gpu/int4-variants.sh "8b"
# EXTRA: more bench.engine flags for every side (e.g. "--quant-head"); VARIANTS: a subset of
# "off persistent fused both rows" (default: all but rows); STREAMS: 1 unless set.
set -u
out=${OUT:-variants-out}
source "$(dirname "${BASH_SOURCE[0]}")/kernel-env.sh"
k=voicert/engine/gpu/kernels.py
for v in ${VARIANTS:-off persistent fused both}; do
  tree=/tmp/int4-$v
  rm -rf "$tree" && mkdir -p "$tree" && cp -r voicert "$tree/"
  case $v in persistent|both) sed -i 's/^INT4_GEMV_PERSISTENT = False/INT4_GEMV_PERSISTENT = True/' "$tree/$k" ;; esac
  case $v in fused|both) sed -i 's/^INT4_PLANES_FUSED = False/INT4_PLANES_FUSED = True/' "$tree/$k" ;; esac
  case $v in rows) sed -i 's/^INT4_GEMV_ROWS = 1 /INT4_GEMV_ROWS = 4 /' "$tree/$k" ;; esac
  echo "$v: $(grep -E '^INT4_(GEMV_PERSISTENT|PLANES_FUSED|GEMV_ROWS) =' "$tree/$k" | cut -d' ' -f1,3 | tr '\n' ' ')"
done
for shape in $1; do
  for round in $(seq "${ROUNDS:-2}"); do
    for v in ${VARIANTS:-off persistent fused both}; do
      (cd "/tmp/int4-$v" && PYTHONPATH=/tmp/int4-$v:/root/site python3 -m voicert.bench.engine \
        --model "llama-$shape-random" --device cuda --int4 --spec 0 --new-tokens 128 --streams "${STREAMS:-1}" \
        --reps 10 --kv-gb 4 --against none --no-baseline ${EXTRA:-}) \
        > "$out/engine-$shape-$v-$round.txt" 2>&1
      echo "== $shape $v round $round"
      grep -E 'TPOT per stream, [0-9]+ streams, decode only \(P50\)' "$out/engine-$shape-$v-$round.txt"
    done
  done
done
