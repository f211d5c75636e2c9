#!/usr/bin/env bash
# FlashAttention-4 beside our attention kernels on the GPU machine (issue 17, item 6): the bench
# (python -m voicert.bench.attention, three shapes) and the GPU tests of the engine's flash prefill.
# The wheels (flash-attn-4 and its CuTe DSL, msgspec, llguidance, gguf) travel as .carry/fa parts,
# one per call, back to back (the machine keeps /root only while it is warm):
#   bash scripts/gpu/attention.sh .carry/fa/part00          # stores the first part
#   bash scripts/gpu/attention.sh .carry/fa/part01 all      # completes, installs, runs (reports under $OUT)
set -uo pipefail
bash scripts/gpu/receive.sh "$1" .carry/fa/SHA256 || exit 1
[ -d /root/whl ] || exit 0
[ -d /root/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /root/site /root/whl/*.whl
source scripts/gpu/env.sh
export PYTHONPATH="$PYTHONPATH:/root/site/nvidia_cutlass_dsl/dsl_packages"
nvidia-smi -L > "$OUT/device.txt"
python3 -c "import flash_attn.cute as f; print('flash-attn-4 imports')" > "$OUT/import.log" 2>&1
what=${2:-all}
if [ "$what" = bench ] || [ "$what" = all ]; then
  for shape in llama-1b llama-8b smollm2; do
    python3 -m voicert.bench.attention --shape "$shape" > "$OUT/attention-$shape.md" 2> "$OUT/attention-$shape.log"
  done
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -q -p no:cacheprovider -s tests/engine/test_flash.py tests/engine/test_gpu.py \
    > "$OUT/tests.log" 2>&1
fi
echo "rc=$?"
