#!/usr/bin/env bash
# The decode-step changes that wait on a GPU: model.gated_down (the down projection takes
# silu(gate) * up in its loads: one launch less a layer) and kernels.L2_PREFETCH_BYTES (a
# PDL-launched Linear brings its weight slice into L2 before it waits), both off by default until
# this is run; and Qwen3 on the fused path (its q/k norms in the RoPE kernel). First the compiled
# tests that check their bits, then each step's GPU time side by side: prefetch sizes in one
# process per shape (the first, 0, is the baseline of the ratio; 0 again last shows the drift),
# with the SiLU kernel and with it fused; last, Qwen3-8B fused against its torch layers.
#   bash scripts/gpu/fusion.sh "SHAPES" "DTYPES" [TESTS]   e.g. bash scripts/gpu/fusion.sh "1b 8b" "bf16 fp8" yes
# Outputs go to $OUT (or ./fusion-out).
set -u
out=${OUT:-fusion-out}
source "$(dirname "${BASH_SOURCE[0]}")/kernel-env.sh"
if [ "${3:-yes}" = yes ]; then
  python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/engine/test_kernels.py \
    > "$out/test_kernels.txt" 2>&1
  tail -3 "$out/test_kernels.txt"
  python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/engine/test_architectures.py \
    -k served_gpu > "$out/test_architectures.txt" 2>&1  # Qwen3 on the fused path, compiled
  tail -3 "$out/test_architectures.txt"
fi
for shape in $1; do
  rows=1
  [ "$shape" = 8b ] && rows=16  # what llm.decode_linear: auto takes at each width
  for dt in $2; do
    extra="--triton-linear-rows $rows"
    [ "$dt" = fp8 ] && extra="--fp8"
    for gated in --no-gated-down --gated-down; do
      echo "== llama-$shape-random $dt $gated"
      python3 -m voicert.bench.profile_step --model "llama-$shape-random" $extra $gated \
        --l2-prefetch-mb 0,8,16,32,0 > "$out/step-$shape-$dt$gated.txt" 2>&1
      grep -E "L2 prefetch|Error" "$out/step-$shape-$dt$gated.txt"
    done
  done
done
# Qwen3 (q/k norms in the RoPE kernel): the fused path against its torch layers, as served before
for fused in --fused-kernels --no-fused-kernels; do
  echo "== qwen3-8b-random bf16 $fused"
  python3 -m voicert.bench.profile_step --model qwen3-8b-random $fused --triton-linear-rows 16 \
    > "$out/step-qwen3-8b$fused.txt" 2>&1
  grep -E "L2 prefetch|Error" "$out/step-qwen3-8b$fused.txt"
done
