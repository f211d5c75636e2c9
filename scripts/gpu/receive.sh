#!/usr/bin/env bash
# Model files travel to an offline GPU machine as parts of one tar (each command's upload is capped):
# append the part given, and once the whole tar is there (its sha256 matches), unpack it into /root.
# Usage: bash scripts/gpu/receive.sh .carry/bundle/partNN .carry/bundle/SHA256
set -euo pipefail
part=$1; want=$(cat "$2")
cat "$part" >> /root/models.tar
have=$(sha256sum /root/models.tar | cut -d' ' -f1)
if [ "$have" = "$want" ]; then
  tar tf /root/models.tar | cut -d/ -f1 | sort -u > /tmp/receive-top.txt
  tar xf /root/models.tar -C /root && rm /root/models.tar
  echo "receive: complete, unpacked into /root: $(tr '\n' ' ' < /tmp/receive-top.txt)"
else
  echo "receive: $(du -m /root/models.tar | cut -f1) MB so far"
fi
