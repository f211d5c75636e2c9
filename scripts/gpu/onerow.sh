#!/usr/bin/env bash
# The one-row Linears' open switches, timed in one GPU call (~8-9 minutes; docs/benchmarks.md
# 66), RANDOM WEIGHTS. Outputs under $OUT (or ./onerow-out):
#   1. int4_gemv.py 8b,1b 128: int4_mma at splits and reads ahead against int4_gemv (kernels);
#   2. gemv_fp8.py 8b sweep: FP8 one-row tiles with and without GEMV_X_WIDE (kernels);
#   3. variants.sh: the engine with GEMV_X_WIDE (FP8) and INT4_GEMV_MMA (INT4) switched on,
#      beside this tree as committed, two rounds on 8b, one on 1b.
#   STEPS="1 2" bash scripts/gpu/onerow.sh, then STEPS=3 (all three pass a call's 10 minutes)
set -u
out=${OUT:-onerow-out}
export OUT=$out
source "$(dirname "${BASH_SOURCE[0]}")/kernel-env.sh"
for step in ${STEPS:-1 2 3}; do
  case $step in
    1) timeout 150 python3 scripts/gpu/int4_gemv.py 8b,1b 128 > "$out/int4-table.txt" 2>&1
       grep -oE "^[^|]*|gemv2x128x1 [0-9.]+ us|mma split [a-z0-9]+ ahead [0-9] [0-9.]+ us" \
         "$out/int4-table.txt" ;;
    2) timeout 200 python3 scripts/gpu/gemv_fp8.py "$out/fp8.json" 8b sweep > "$out/fp8-table.txt" 2>&1
       grep -E "^\| llama" "$out/fp8-table.txt" ;;
    3) for shape in 8b 1b; do
         rounds=2; [ "$shape" = 1b ] && rounds=1
         TAG=fp8- FLAGS=--fp8 VARIANTS="off xwide" ROUNDS=$rounds timeout 200 \
           bash scripts/gpu/variants.sh "$shape"
         TAG=int4- VARIANTS="off mma" ROUNDS=$rounds timeout 200 bash scripts/gpu/variants.sh "$shape"
       done ;;
  esac
done
