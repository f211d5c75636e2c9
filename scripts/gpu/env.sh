# Source from the repo root on the GPU machine: the offline site-packages, the repo on PYTHONPATH,
# the cuBLAS 12 name CTranslate2 wants on a CUDA 13 host, and where the model files are.
export PYTHONPATH="$PWD:/root/site${PYTHONPATH:+:$PYTHONPATH}"
source "$(dirname "${BASH_SOURCE[0]}")/cublas-shim.sh"
export VOICERT_MODELS__CACHE_DIR=/root/cache
export VOICERT_MODELS__ASR=/root/models/tiny
export VOICERT_MODELS__LLM=/root/models/SmolLM2-135M-Instruct.Q4_1.gguf
