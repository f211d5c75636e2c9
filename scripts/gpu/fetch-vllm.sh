#!/usr/bin/env bash
# Fetch vLLM 0.26.0 with what its OpenAI server imports (uvicorn, fastapi...) (pins torch 2.11, CUDA 13 build: matches the GPU machine) and the small wheels it
# imports on the offline LLM(...) path, trimmed to what dense Llama-family models need on Hopper, into
# ./.carry/vllm/ as parts that fit one upload each. Run from the repo root (keep /.carry/ and /.whl/ in
# .git/info/exclude). Seen working on an H100 on 2026-11-22 (LLM(..., load_format="dummy")).
# On the GPU machine, after the parts are there (one upload per part, back to back):
#   cat PARTS > /root/vb.tar && mkdir -p /root/vb /root/vsite && tar xf /root/vb.tar -C /root/vb \
#   && python3 -m pip install -q --no-index --no-deps --no-compile --target /root/vsite /root/vb/deps/*.whl \
#   && tar xJf /root/vb/vllm.tar.xz -C /root/vsite     # then PYTHONPATH=/root/vsite, VLLM_USE_FLASHINFER_SAMPLER=0
set -euo pipefail
out=.carry/vllm; work=$(mktemp -d); mkdir -p "$out" "$work/deps" "$work/v"
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
P=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
   --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
   --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_5_x86_64
   --platform manylinux1_x86_64)
python3 -m pip download -q "${P[@]}" -d "$work" vllm==0.26.0
python3 -m pip download -q "${P[@]}" -d "$work/deps" "pydantic==2.13.5" "pydantic-core==2.46.5" \
  annotated-types typing-inspection "fastapi>=0.133,<0.137" "starlette>=1.0.1" "openai>=2.25,<3" jiter \
  distro sniffio openai-harmony msgspec pyzmq cbor2 cachetools partial-json-parser pybase64 setproctitle \
  blake3 "depyf==0.20.0" astor dill "llguidance>=1.7,<1.8" "xgrammar==0.2.8" "outlines_core==0.2.14" \
  "lm-format-enforcer==0.11.3" "lark==1.2.2" interegular "apache-tvm-ffi==0.1.11" \
  uvicorn h11 click httptools "prometheus-fastapi-instrumentator" python-multipart aiohttp aiosignal \
  frozenlist multidict yarl propcache aiohappyeyeballs attrs idna "anyio>=4" httpx httpcore certifi \
  websockets watchfiles python-dotenv py-cpuinfo psutil requests charset-normalizer urllib3 \
  "prometheus_client" "tiktoken" regex "gguf" "diskcache" "einops" "cloudpickle" \
  "pillow" "sentencepiece" "protobuf" "compressed-tensors" "loguru" "pyjwt"
(cd "$work/v" && unzip -q ../vllm-0.26.0-*.whl \
  && rm -rf vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so vllm/_qutlass_C.abi3.so \
            vllm/_flashmla_C.abi3.so vllm/_flashmla_extension_C.abi3.so vllm/third_party/deep_gemm \
            vllm/third_party/fmha_sm100 \
  && tar cJf ../vllm.tar.xz .)
tar cf "$work/vb.tar" -C "$work" vllm.tar.xz deps
rm -f "$out"/part*; split -b 40M -d "$work/vb.tar" "$out/part"  # (40 MB: with the ~15 MB tree, one part a call fits 64 MiB)
sha256sum "$work/vb.tar" | cut -d' ' -f1 > "$out/SHA256"
rm -rf "$work"; ls -la "$out"
