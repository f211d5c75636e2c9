#!/usr/bin/env bash
# Piper on the GPU (issue 19): onnxruntime-gpu 1.31.1 (a CUDA 13 build, as the lent machines' CUDA is)
# loading the CUDA and cuDNN libraries torch's wheels put on the machine; Piper on the box's CPU side
# by side in the same command (python -m voicert.bench.tts; VOICES=espeak,piper,piper-cuda adds eSpeak
# NG). No round trip there (Whisper is not on the machine): the spoken replies come back under
# $OUT/tts for `python -m voicert.bench.tts --wer-of DIR` here.
# The wheels travel as parts of one tar (docs/gpu.md, "Piper on the GPU"), one call per part, back to
# back; the call whose part completes the tar installs and runs.
# Usage: bash scripts/gpu/piper-gpu.sh .carry/gx/partNN
set -uo pipefail
cat "$1" >> /root/gx.tar
if [ "$(sha256sum /root/gx.tar | cut -d' ' -f1)" != "$(cat .carry/gx/SHA256)" ]; then
  echo "gx: $(du -m /root/gx.tar | cut -f1) MB so far"; exit 0
fi
mkdir -p /root/gx && tar xf /root/gx.tar -C /root/gx || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/ortg /root/gx/whl/onnxruntime_gpu-*.whl || exit 4
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site \
  $(ls /root/gx/whl/*.whl | grep -v onnxruntime_gpu) || exit 4
libs=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({os.path.dirname(f) for p in nvidia.__path__ for f in glob.glob(os.path.join(p, '**', 'lib*.so*'), recursive=True)})))")
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="/root/ortg:$PWD:/root/site"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
nproc | tee -a $OUT/gpu.txt
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())" 2>&1 | tee $OUT/ort.txt
timeout ${TTS_LIMIT:-400} python3 -m voicert.bench.tts --voices ${VOICES:-piper,piper-cuda} --first-words ${FIRST_WORDS:-0,6} \
  --repeat ${REPEAT:-5} --no-wer --save $OUT/tts > $OUT/tts.md 2> $OUT/tts.log
echo "rc=$?"
cat $OUT/tts.md
grep -v '^{' $OUT/tts.log | grep -i 'provider\|error\|warn\|fail' | head -20
