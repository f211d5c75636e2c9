#!/usr/bin/env bash
# End-of-turn figures on the GPU config (python -m voicert.bench.turns --eot): the same renderings
# as a CPU run (made there with --renderings, carried here), scored by the models on this box
# (Whisper tiny.en and SmolLM2 on the GPU, VAD and smart-turn on its CPU), then the tables.
# Before: one call per bundle part (bash scripts/gpu/receive.sh .carry/eot/partNN .carry/eot/SHA256,
# carrying that part and SHA256); the bundle holds /root/models (tiny, SmolLM2 GGUF), /root/whl
# (ctranslate2, faster-whisper, gguf, websockets 15, soxr, msgspec, llguidance, silero-vad,
# prometheus_client, pipecat-ai) and /root/renderings.npz. Output under $OUT.
# Usage: bash scripts/gpu/eot.sh [--conditions clean,noisy,phone] [--set section.key=value ...]
#   env: SIGNALS (default $OUT/signals.json): keep them under /root to score the set over several
#   calls (each call completes what the file lacks; a copy comes back in $OUT)
set -uo pipefail
[ -f /root/renderings.npz ] || { echo "eot: the bundle is not here yet (scripts/gpu/receive.sh)"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /root/site /root/whl/*.whl
python3 -c 'import av' 2>/dev/null || { mkdir -p /root/site/av && echo '"""stub"""' > /root/site/av/__init__.py; }
source scripts/gpu/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
python3 -m voicert.bench.turns --eot --config configs/gpu.yaml --renderings /root/renderings.npz \
  --signals "${SIGNALS:=$OUT/signals.json}" "$@" > "$OUT/eot.md" 2> "$OUT/eot.log" || { tail -30 "$OUT/eot.log"; exit 1; }
[ "$SIGNALS" = "$OUT/signals.json" ] || cp "$SIGNALS" "$OUT/signals.json"
cat "$OUT/eot.md"
date -u
