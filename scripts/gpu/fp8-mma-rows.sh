#!/usr/bin/env bash
# FP8 steps of 8-32 rows: the widening kernel (as served up to kernels.FP8_MMA_ROWS = 32) against
# the FP8 tensor cores with the activations quantized per row (threshold 4), one decode step's GPU
# time (profile_step), 8B and 1B shapes, RANDOM WEIGHTS. Outputs in $OUT (or ./mma-out).
out=${OUT:-mma-out}
source scripts/gpu/kernel-env.sh
for spec in "8b 8 16 32" "1b 8 32"; do  # a shape, then its batch sizes
  set -- $spec
  shape=$1; shift
  for b in "$@"; do for r in 32 4; do
    echo "== $shape fp8 batch $b, FP8_MMA_ROWS $r"
    python3 -m voicert.bench.profile_step --model llama-$shape-random --fp8 --batch $b \
      --fp8-mma-rows $r > $out/mma-$shape-b$b-r$r.txt 2>&1
    grep -E "graph step|Error" $out/mma-$shape-b$b-r$r.txt
  done; done
done
