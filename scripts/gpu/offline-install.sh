#!/usr/bin/env bash
# On a GPU machine with no network: install the wheels brought in .whl/ (cp312) into /root/site
# without touching the system environment. Then: source scripts/gpu/env.sh
# Usage: bash scripts/gpu/offline-install.sh
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /root/site .whl/*.whl
# faster-whisper imports PyAV at import time; voicert hands it numpy audio, so a stub does (PyAV is
# 35 MB). Skip this where PyAV is installed.
python3 -c 'import av' 2>/dev/null || { mkdir -p /root/site/av && printf '"""Stub: voicert passes numpy audio to faster-whisper."""\n' > /root/site/av/__init__.py; }
echo "installed into /root/site: $(ls /root/site | grep -c dist-info) packages"
