#!/usr/bin/env bash
# Regenerates the spoken test WAVs (16 kHz mono PCM16) with espeak-ng and sox (Debian packages).
set -euo pipefail
cd "$(dirname "$0")"
say() {  # say NAME VOICE SPEED TEXT   (NAME may be in a folder: lang/x)
  local tmp="/tmp/voicert-${1//\//-}.wav"
  espeak-ng -v "$2" -s "$3" -w "$tmp" "$4"
  sox "$tmp" -r 16000 -c 1 -b 16 "$1.wav"
  rm -f "$tmp"
}
say capital_of_france en-us 150 "What is the capital of France?"
say what_about_germany en-us 150 "And what about Germany?"
say tell_me_a_joke en-gb 140 "Can you tell me a short joke?"
say weather_question en-us 160 "What is the weather usually like in London?"
say count_to_five en-us 150 "Please count from one to five."
say lang/bonjour_fr fr 140 "Bonjour, je voudrais réserver une table pour deux personnes ce soir, s'il vous plaît."  # asr.language auto
