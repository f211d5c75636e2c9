#!/usr/bin/env bash
# INT4 beside vLLM 0.26.0 on the same AWQ weights (issue "The engine at the bandwidth limit",
# item 1): a Llama shape with RANDOM WEIGHTS (timing only) written by random_llama.py, rounded to
# INT4 (nearest, groups of 128) and saved as an AWQ checkpoint (python -m voicert.engine.export_awq).
# voicert's engine loads it as Int4Linear layers (our kernel); vLLM loads the same directory with
# its AWQ Marlin kernels (chosen by itself from the config). Then the engine bench, side by side.
# Before it: every part of .carry/vllm (scripts/gpu/fetch-vllm.sh) but the last appended to
# /root/vb.tar, one call each; this call carries the last part, .carry/vllm/SHA256 and .carry/tok.
# Usage: bash scripts/gpu/int4-vllm.sh LAST_PART [shapes, default "8b"] [streams, default 1,8,32,64]
set -uo pipefail
last=$1; shapes=${2-8b}; streams=${3-1,8,32,64}
bash scripts/gpu/vllm-install.sh "$last" || exit $?
export PYTHONPATH=$PWD:/root/vsite VLLM_USE_FLASHINFER_SAMPLER=0
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader | tee $OUT/gpu.txt
for s in $shapes; do
  [ -f /root/llama-$s/config.json ] || python3 scripts/gpu/random_llama.py .carry/tok /root/llama-$s $s
  [ -f /root/llama-$s-awq/config.json ] || python3 -m voicert.engine.export_awq /root/llama-$s \
    /root/llama-$s-awq --rounding nearest 2>&1 | tail -1 | tee $OUT/awq-$s.txt
  python3 -m voicert.bench.engine --model /root/llama-$s-awq --against vllm --spec 0 \
    --new-tokens 128 --streams "$streams" --reps 20 --json $OUT/engine-$s-int4.json \
    > $OUT/engine-$s-int4.md 2> $OUT/engine-$s-int4.log
  echo "$s int4 (AWQ): exit $?"
done
