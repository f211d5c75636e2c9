#!/usr/bin/env bash
# Unpack the vLLM bundle (scripts/gpu/fetch-vllm.sh) into /root/vsite on the GPU machine, once:
# LAST_PART is appended to /root/vb.tar (the earlier parts were appended by earlier calls), the
# sha256 checked against .carry/vllm/SHA256, the wheels installed. Then the wheels in .carry/vfix,
# if carried (ones an older bundle lacks). Exit 3: bad checksum; 4: unpacking failed.
# Usage: bash scripts/gpu/vllm-install.sh LAST_PART
set -uo pipefail
if [ ! -d /root/vsite/vllm ]; then
  cat "$1" >> /root/vb.tar
  [ "$(sha256sum /root/vb.tar | cut -d' ' -f1)" = "$(cat .carry/vllm/SHA256)" ] || { echo "vb.tar: bad sha256"; exit 3; }
  mkdir -p /root/vb /root/vsite && tar xf /root/vb.tar -C /root/vb \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target /root/vsite /root/vb/deps/*.whl \
    && tar xJf /root/vb/vllm.tar.xz -C /root/vsite || exit 4
fi
if [ -d .carry/vfix ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /root/vsite .carry/vfix/*.whl
fi
exit 0
