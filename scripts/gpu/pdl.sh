#!/usr/bin/env bash
# Programmatic dependent launch (llm.pdl) on the GPU machine: the compiled kernel tests, then the
# engine bench with PDL against the same engine without it, in one command per shape and dtype.
#   bash scripts/gpu/pdl.sh "TESTS" "SHAPES" "DTYPES"   e.g. bash scripts/gpu/pdl.sh kernels "1b 8b" "bf16 fp8"
# TESTS: kernels | gpu | "kernels gpu" | none. Outputs go to $OUT (or ./pdl-out).
set -u
out=${OUT:-pdl-out}
source "$(dirname "${BASH_SOURCE[0]}")/kernel-env.sh"
for t in $1; do
  [ "$t" = none ] && continue
  python3 -m pytest -q -p no:cacheprovider -o addopts="" "tests/engine/test_$t.py" > "$out/test_$t.txt" 2>&1
  tail -3 "$out/test_$t.txt"
done
for shape in $2; do
  for dt in $3; do
    extra=""
    [ "$dt" = fp8 ] && extra="--fp8"
    python3 -m voicert.bench.engine --model "llama-$shape-random" --device cuda --against no-pdl \
      $extra --spec 0 --new-tokens 128 --streams 1,8,64 --reps 10 --kv-gb 4 > "$out/engine-$shape-$dt.txt" 2>&1
    grep -E "^\|" "$out/engine-$shape-$dt.txt" | head -30
  done
done
