#!/usr/bin/env bash
# FlashAttention-4 beside our attention kernels on the GPU machine (issue 17, item 6): the bench
# (python -m voicert.bench.attention, three shapes) and the GPU tests of the engine's flash prefill.
# The wheels (flash-attn-4 and its CuTe DSL, msgspec, llguidance, gguf) travel as .carry/fa parts,
# one per call, back to back (the machine keeps /root only while it is warm):
#   bash scripts/gpu/attention.sh .carry/fa/part00          # stores the first part
#   bash scripts/gpu/attention.sh .carry/fa/part01 all|bench|tests|ttft|splits   # completes, installs, runs
# (reports under $OUT; ttft: bench.engine with FA4 prefill against gather + SDPA prefill, 1B and 8B)
set -uo pipefail
# the bundle's own wheel marks it received (another bundle may have left /root/whl behind)
have() { compgen -G "/root/whl/flash_attn_4-*.whl" > /dev/null; }
have || bash scripts/gpu/receive.sh "$1" .carry/fa/SHA256 || exit 1
have || exit 0
[ -d /root/site/flash_attn ] || python3 -m pip install -q --no-index --no-deps --no-compile \
  --target /root/site /root/whl/*.whl
source scripts/gpu/env.sh
export PYTHONPATH="$PYTHONPATH:/root/site/nvidia_cutlass_dsl/dsl_packages"
nvidia-smi -L > "$OUT/device.txt"
python3 -c "import flash_attn.cute as f; print('flash-attn-4 imports')" > "$OUT/import.log" 2>&1
what=${2:-all}
bench() { timeout 240 python3 -m voicert.bench.attention --shape "$1" --replays 50 \
            > "$OUT/attention-$1.md" 2> "$OUT/attention-$1.log"; }
flash_tests() { timeout 240 python3 -m pytest -q -p no:cacheprovider -s tests/engine/test_flash.py \
                  > "$OUT/tests-flash.log" 2>&1; }
ttft() { timeout 280 python3 -m voicert.bench.engine --model "$1" --against sdpa-prefill \
           --prefill-attention flash --spec 0 --streams 1,16,64 --new-tokens 64 --kv-gb 8 \
           > "$OUT/engine-$1.md" 2> "$OUT/engine-$1.log"; }
case "$what" in
  ttft) ttft llama-1b-random; ttft llama-8b-random ;;
  splits) for shape in llama-1b llama-8b; do  # FA4's own split heuristic, for decode
            timeout 240 python3 -m voicert.bench.attention --shape "$shape" --replays 50 \
              --flash-splits 0 --backends triton,flash \
              --cases 1x1x600,8x1x600,32x1x1024,64x1x2048,1x1x4096,16x3x1024 \
              > "$OUT/splits-$shape.md" 2> "$OUT/splits-$shape.log"; done ;;
  all) bench llama-1b; flash_tests; bench llama-8b; bench smollm2 ;;
  bench) bench llama-1b; bench llama-8b; bench smollm2 ;;
  tests) flash_tests; timeout 500 python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py \
           > "$OUT/tests-gpu.log" 2>&1 ;;
esac
echo "rc=$?"
