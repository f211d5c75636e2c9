#!/usr/bin/env bash
# Regenerates the turn-taking evaluation set (python -m voicert.bench.turns) with espeak-ng and sox
# (Debian packages): 16 kHz mono PCM16 WAVs and turns.tsv (id, kind, voice, rate, pause ms, text;
# "|" marks where a "pause" utterance stops mid-sentence).
#   pause:    an incomplete phrase, a 0.7-1.0 s pause, then the rest (must not be cut at the pause)
#   complete: a whole question or request (should end quickly)
#   backchannel: said over the agent's reply: must not interrupt it
#   interject: said over the agent's reply: must interrupt it
set -euo pipefail
cd "$(dirname "$0")"
rm -f turns.tsv
say() {  # say ID KIND VOICE RATE PAUSE_MS TEXT
  local id=$1 kind=$2 voice=$3 rate=$4 pause=$5 text=$6 ssml
  ssml=${text//|/<break time=\"${pause}ms\"\/>}
  espeak-ng -m -v "$voice" -s "$rate" -w "/tmp/voicert-turn-$id.wav" "<speak>$ssml</speak>"
  sox "/tmp/voicert-turn-$id.wav" -r 16000 -c 1 -b 16 "$id.wav"
  rm -f "/tmp/voicert-turn-$id.wav"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$kind" "$voice" "$rate" "$pause" "$text" >> turns.tsv
}
say p01 pause en-us 150 800 "I would like to book a table for | four people tonight."
say p02 pause en-us 160 900 "Can you tell me about the | weather in Paris tomorrow?"
say p03 pause en-gb 140 750 "My name is John and I want to | change my booking."
say p04 pause en-us+f3 170 1000 "I need to cancel my reservation for | Friday evening."
say p05 pause en-gb+m3 150 800 "Could you remind me to call my | sister at six?"
say p06 pause en-us+f3 150 850 "The meeting was moved from Monday to | Wednesday afternoon."
say p07 pause en-gb 150 700 "How far is it from London to | Edinburgh by train?"
say p08 pause en-us+m3 140 900 "Please send the invoice to my | work address."
say p09 pause en-us 150 800 "I was wondering if you could help me with | my order."
say p10 pause en-gb+f3 160 950 "What is the best way to get from the airport to | the city centre?"
say p11 pause en-us 150 800 "I want to order a large | pepperoni pizza."
say p12 pause en-gb 140 900 "Tell me a story about a brave | little dragon."
say c01 complete en-us 150 0 "What is the capital of France?"
say c02 complete en-gb 140 0 "Can you tell me a short joke?"
say c03 complete en-us 170 0 "Book a table for four people tonight."
say c04 complete en-us+f3 150 0 "Thank you, that is all."
say c05 complete en-gb+m3 160 0 "What time does the store open on Sunday?"
say c06 complete en-us+m3 140 0 "I would like a coffee, please."
say c07 complete en-gb+f3 150 0 "How tall is Mount Everest?"
say c08 complete en-us 180 0 "Turn off the lights in the kitchen."
say c09 complete en-gb 150 0 "Who wrote Romeo and Juliet?"
say c10 complete en-us+f3 160 0 "My flight number is two four seven."
say c11 complete en-us 150 0 "Is it going to rain tomorrow?"
say c12 complete en-gb+m3 140 0 "Play some relaxing music."
say b01 backchannel en-us 150 0 "Mm-hm."
say b02 backchannel en-gb 150 0 "Yeah."
say b03 backchannel en-us+f3 160 0 "Okay."
say b04 backchannel en-gb+m3 150 0 "Right."
say b05 backchannel en-us 140 0 "Uh-huh."
say b06 backchannel en-us+m3 160 0 "I see."
say b07 backchannel en-gb+f3 150 0 "Yeah, okay."
say b08 backchannel en-us 170 0 "Sure."
say i01 interject en-us 150 0 "Wait."
say i02 interject en-gb 150 0 "Stop, stop."
say i03 interject en-us+f3 160 0 "Hold on, what did you say?"
say i04 interject en-gb+m3 150 0 "No, that is wrong."
