#!/usr/bin/env bash
# The restaurant agent's tool eval on the GPU config (python -m voicert.bench.tools eval), with the
# real SmolLM2 and Whisper weights. Send .carry/bundle/part00..03 first (scripts/gpu/receive.sh);
# this command carries part04, .carry/toolswhl and .carry/extra. Tables under $OUT.
set -uo pipefail
[ -d /root/models ] || bash scripts/gpu/receive.sh .carry/bundle/part04 .carry/bundle/SHA256 || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /root/site \
  /root/whl/*.whl .carry/extra/silero_vad-*.whl .carry/toolswhl/llguidance-*.whl
python3 -c 'import av' 2>/dev/null || { mkdir -p /root/site/av && echo '"""stub"""' > /root/site/av/__init__.py; }
source scripts/gpu/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
date -u | tee -a $OUT/gpu.txt
for choice in server required; do
  timeout 250 python3 -m voicert.bench.tools eval --config examples/restaurant/config-gpu.yaml \
    --choice $choice --json > $OUT/eval-$choice.json 2> $OUT/eval-$choice.log
  python3 -c "import json,sys; from voicert.bench.tools import render_eval; print(render_eval(json.load(open(sys.argv[1]))))" \
    $OUT/eval-$choice.json | tee $OUT/eval-$choice.md
done
date -u
