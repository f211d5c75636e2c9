#!/usr/bin/env bash
# Builds the ASR evaluation set from sentences.tsv (id, espeak-ng voice, words/min, condition, text):
# clean 16 kHz; "noise": white noise mixed at 10 dB SNR; "mulaw": 8 kHz G.711 mu-law (as a phone
# line carries it, stored as .wav with mu-law encoding); "noise_mulaw": both. Needs espeak-ng, sox.
set -euo pipefail
cd "$(dirname "$0")"
while IFS=$'\t' read -r id voice speed cond text; do
  raw=/tmp/voicert-eval-$id.wav
  espeak-ng -v "$voice" -s "$speed" -w "$raw" "$text"
  sox "$raw" -r 16000 -c 1 -b 16 /tmp/voicert-eval-$id-16k.wav
  src=/tmp/voicert-eval-$id-16k.wav
  if [[ $cond == noise* ]]; then
    # white noise 10 dB below the speech RMS level
    rms=$(sox "$src" -n stat 2>&1 | awk '/RMS +amplitude/ {print $3}')
    len=$(soxi -D "$src")
    sox -n -r 16000 -c 1 -b 16 /tmp/voicert-eval-$id-noise.wav synth "$len" whitenoise vol "$(python3 -c "print($rms / 10 ** (10 / 20) / 0.577)")"
    sox -m "$src" /tmp/voicert-eval-$id-noise.wav /tmp/voicert-eval-$id-mix.wav
    src=/tmp/voicert-eval-$id-mix.wav
  fi
  if [[ $cond == *mulaw ]]; then
    sox "$src" -r 8000 -c 1 -e mu-law "$id.wav"
  else
    cp "$src" "$id.wav"
  fi
  rm -f /tmp/voicert-eval-$id*
done < sentences.tsv
