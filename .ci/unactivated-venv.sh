#!/usr/bin/env bash
# The README's setup in a virtual environment that is NOT activated, then the tests that look up
# Python or its programs (python3, hadolint) run with that venv's interpreter, as the README says
# (.venv/bin/python for python3). PATH does not hold the venv; its python3 is a bare Python
# without the test extras (a venv of its own), as a newcomer's system Python is: a test or a tool
# that takes python3 or a program from PATH instead of the running environment fails here. A
# venv with --system-site-packages would hide that, so the venv gets the extras itself.
set -euo pipefail
cd "$(dirname "$0")/.."

# CARRY_CI_VENV=DIR takes a venv that already has the README's setup (to try this step locally).
t0=$SECONDS
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
venv=${CARRY_CI_VENV:-$scratch/venv}
if [ -z "${CARRY_CI_VENV:-}" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'
fi
python3 -m venv --without-pip "$scratch/bare"
echo "venv ready after $((SECONDS - t0)) s"

# PATH: the bare python3 first, and no folder that holds hadolint (a Python environment's bin/,
# the system Python's where CI's setup installed the extras): the venv's own programs must be
# found beside its interpreter, as for a newcomer whose venv is not activated.
keep=$(printf '%s' "$PATH" | tr ':' '\n' | while read -r d; do
  if [ -n "$d" ] && [ ! -e "$d/hadolint" ]; then printf '%s:' "$d"; fi
done)
set +e
env PATH="$scratch/bare/bin:${keep%:}" "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider \
  tests/test_readme.py tests/test_images.py::test_dockerfile_is_hadolint_clean "$@" 2>&1 | tee "$scratch/log"
rc=${PIPESTATUS[0]}
set -e
echo "unactivated-venv tests took $((SECONDS - t0)) s in all"
# A skip is not a pass here: hadolint is in the venv, so its test must run (that skip is a bug).
if grep -q "^SKIPPED.*hadolint" "$scratch/log"; then
  echo "the hadolint test skipped although the venv has hadolint" >&2
  exit 1
fi
exit "$rc"
