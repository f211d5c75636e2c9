#!/usr/bin/env bash
# The engine bench against vLLM 0.26.0 in one command on the GPU machine, bf16 and FP8, on the
# Llama-3.2-1B and Llama-3.1-8B shapes (RANDOM WEIGHTS, timing only), plus the FP8 kernel table.
# Before it: every part of .carry/vllm (scripts/gpu/fetch-vllm.sh) but the last appended to
# /root/vb.tar, one call each (cat PART >> /root/vb.tar); this call carries the last part and
# .carry/vllm/SHA256. Tables land in $OUT. KERNELS=0: no FP8 kernel table; BLOCKS: its tiles.
# Usage: bash scripts/gpu/engine-vllm.sh LAST_PART [shapes, default "1b 8b"] [modes, default "bf16 fp8"]
# A shape is 1b or 8b (the Llama shapes) or any name of bench/shapes.py's SHAPES (qwen3-8b-random).
set -uo pipefail
last=$1; shapes=${2-1b 8b}; modes=${3-bf16 fp8}  # "" "": install only
bash scripts/gpu/vllm-install.sh "$last" || exit $?
export PYTHONPATH=$PWD:/root/vsite VLLM_USE_FLASHINFER_SAMPLER=0
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader | tee $OUT/gpu.txt
# the FP8 kernel table (KERNELS=0 skips it), with a few other tile configs beside the default
[ "${KERNELS:-1}" = 1 ] && python3 -m voicert.bench.fp8 --no-quality --rows 1,8,32,64 \
  --blocks "${BLOCKS:-16x32x256x4x4,16x64x128x4x4,16x16x512x4x3,16x128x128x8x4}" \
  > $OUT/fp8-kernels.md 2> $OUT/fp8-kernels.log
for s in $shapes; do
  for m in $modes; do
    flag=""; [ "$m" = fp8 ] && flag="--fp8"
    model=$s; case $s in 1b|8b) model=llama-$s-random;; esac
    python3 -m voicert.bench.engine --model $model --against vllm $flag --spec 0 \
      --new-tokens 128 --streams 1,8,32,64 --reps 20 --json $OUT/engine-$s-$m.json \
      > $OUT/engine-$s-$m.md 2> $OUT/engine-$s-$m.log
    echo "$s $m: exit $?"
  done
done
