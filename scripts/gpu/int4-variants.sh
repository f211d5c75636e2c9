#!/usr/bin/env bash
# INT4 switches timed side by side in one command: bench.engine (--int4) on this tree as
# committed and on copies with one switch of kernels.py turned, round-robin
# (docs/benchmarks.md 64, 65):
#   unfused  INT4_PLANES_FUSED off (the one-row x laid out by its own launch)
#   rows1    INT4_GEMV_ROWS 1 (two rows by the MMA kernel)
#   rows4    INT4_GEMV_ROWS 4 (up to four rows on the CUDA cores)
#   ROUNDS=2 bash scripts/gpu/int4-variants.sh "8b 1b"     outputs under $OUT (or ./variants-out)
#   VARIANTS="off rows1 rows4" STREAMS=2,4 ROUNDS=1 bash scripts/gpu/int4-variants.sh "8b"
# EXTRA: more bench.engine flags for every side (e.g. "--quant-head"); VARIANTS: "off" and a
# subset of the above (default: off unfused); STREAMS: 1 unless set.
set -u
out=${OUT:-variants-out}
source "$(dirname "${BASH_SOURCE[0]}")/kernel-env.sh"
k=voicert/engine/gpu/kernels.py
for v in ${VARIANTS:-off unfused}; do
  tree=/tmp/int4-$v
  rm -rf "$tree" && mkdir -p "$tree" && cp -r voicert "$tree/"
  case $v in
    unfused) sed -i 's/^INT4_PLANES_FUSED = True/INT4_PLANES_FUSED = False/' "$tree/$k" ;;
    rows1) sed -i 's/^INT4_GEMV_ROWS = [0-9]* /INT4_GEMV_ROWS = 1 /' "$tree/$k" ;;
    rows4) sed -i 's/^INT4_GEMV_ROWS = [0-9]* /INT4_GEMV_ROWS = 4 /' "$tree/$k" ;;
  esac
  echo "$v: $(grep -E '^INT4_(PLANES_FUSED|GEMV_ROWS) =' "$tree/$k" | cut -d' ' -f1,3 | tr '\n' ' ')"
done
for shape in $1; do
  for round in $(seq "${ROUNDS:-2}"); do
    for v in ${VARIANTS:-off unfused}; do
      (cd "/tmp/int4-$v" && PYTHONPATH=/tmp/int4-$v:/root/site python3 -m voicert.bench.engine \
        --model "llama-$shape-random" --device cuda --int4 --spec 0 --new-tokens 128 --streams "${STREAMS:-1}" \
        --reps 10 --kv-gb 4 --against none --no-baseline ${EXTRA:-}) \
        > "$out/engine-$shape-$v-$round.txt" 2>&1
      echo "== $shape $v round $round"
      grep -E 'TPOT per stream, [0-9]+ streams, decode only \(P50\)' "$out/engine-$shape-$v-$round.txt"
    done
  done
done
