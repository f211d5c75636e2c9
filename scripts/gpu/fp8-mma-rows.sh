#!/usr/bin/env bash
# FP8 steps of 8-32 rows: the widening kernel (as served up to kernels.FP8_MMA_ROWS = 32) against
# the FP8 tensor cores with the activations quantized per row (threshold 4), one decode step's GPU
# time (profile_step), 8B and 1B shapes, RANDOM WEIGHTS. Outputs in $OUT (or ./mma-out).
out=${OUT:-mma-out}
source scripts/gpu/kernel-env.sh
for b in 8 16 32; do for r in 32 4; do
  echo "== 8b fp8 batch $b, FP8_MMA_ROWS $r"
  python3 -m voicert.bench.profile_step --model llama-8b-random --fp8 --batch $b --fp8-mma-rows $r > $out/mma-8b-b$b-r$r.txt 2>&1
  grep -E "graph step|Error" $out/mma-8b-b$b-r$r.txt
done; done
for b in 8 32; do for r in 32 4; do
  echo "== 1b fp8 batch $b, FP8_MMA_ROWS $r"
  python3 -m voicert.bench.profile_step --model llama-1b-random --fp8 --batch $b --fp8-mma-rows $r > $out/mma-1b-b$b-r$r.txt 2>&1
  grep -E "graph step|Error" $out/mma-1b-b$b-r$r.txt
done; done
