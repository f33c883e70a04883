#!/usr/bin/env bash
# Step 90 and the image's CMD: verify.py with the first Python at hand (the
# verify itself runs each venv's own interpreter). Arguments pass through.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for py in python3 /opt/nemo_rl_venv/bin/python; do
  if command -v "$py" >/dev/null 2>&1; then exec "$py" "$here/verify.py" "$@"; fi
done
echo "[90-verify] error: no python3 found" >&2
exit 1
