# shellcheck shell=bash
# Shared helpers of the gtp-te219 steps. Sourced, never run.
#
# The steps run inside `docker build` (values come from build args), on a
# Slurm node with enroot, in a plain venv or on a GPU machine without Docker
# (values come from the image.env that tools/build_image.py writes next to the
# wheels; run-local.sh sources it). Inputs, all environment variables:
#   GTP_FLAVOR            cpu | cuda
#   GTP_WHEELHOUSE        folder with the patched wheels, series.json, nemo-rl/*.patch
#   GTP_VENVS             venvs to consider (globs, space separated); only those
#                         that carry megatron-core are changed
#   GTP_TE_VERSION GTP_TE_FLOOR GTP_CUDNN_FRONTEND_FLOOR GTP_TE_CORE
#   NVTE_CUDA_ARCHS MAX_JOBS     the TE build (cuda flavour)
#   GTP_TE_WHEELHOUSE     optional: install TE offline from this folder
#   GTP_NEMO_RL_DIR GTP_NEMO_RL_COMMIT   (an empty GTP_NEMO_RL_DIR: no checkout, skip)
#   GTP_TARGET_VENVS      optional: exactly these venvs (run-local.sh --venv)
# Network settings arrive as BuildKit secrets (never in a layer):
#   /run/secrets/gtp-ca     a CA bundle for pip and uv
#   /run/secrets/gtp-index  KEY=VALUE lines: PIP_INDEX_URL, PIP_EXTRA_INDEX_URL

GTP_STEP="${GTP_STEP:-$(basename "${0%.sh}")}"
GTP_SECRETS="${GTP_SECRETS:-/run/secrets}"

log() { printf '[%s] %s\n' "$GTP_STEP" "$*"; }
die() { printf '[%s] error: %s\n' "$GTP_STEP" "$*" >&2; exit 1; }

need_var() {
  local name
  for name in "$@"; do
    [ -n "${!name:-}" ] || die "$name is not set (docker: a build arg; outside Docker: source the image.env)"
  done
}

# pip and uv find the CA bundle and the package index through these variables.
setup_network() {
  if [ -r "$GTP_SECRETS/gtp-ca" ]; then
    export SSL_CERT_FILE="$GTP_SECRETS/gtp-ca" PIP_CERT="$GTP_SECRETS/gtp-ca" REQUESTS_CA_BUNDLE="$GTP_SECRETS/gtp-ca"
  fi
  if [ -r "$GTP_SECRETS/gtp-index" ]; then
    local key value
    while IFS='=' read -r key value; do
      case "$key" in
        PIP_INDEX_URL) export PIP_INDEX_URL="$value" UV_INDEX_URL="$value" ;;
        PIP_EXTRA_INDEX_URL) export PIP_EXTRA_INDEX_URL="$value" UV_EXTRA_INDEX_URL="$value" ;;
        ""|\#*) ;;
        *) die "gtp-index secret: unexpected key $key" ;;
      esac
    done < "$GTP_SECRETS/gtp-index"
  fi
}

# version_ge A B: A >= B (PEP 440 release parts; good enough for TE and frontend versions).
version_ge() {
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]
}

# Every existing venv matched by GTP_VENVS.
all_venvs() {
  local pattern v
  for pattern in $GTP_VENVS; do
    for v in $pattern; do
      [ -x "$v/bin/python" ] && echo "$v"
    done
  done
}

dist_version() {  # dist_version VENV DIST -> version, or nothing
  "$1/bin/python" - "$2" <<'PY' 2>/dev/null || true
import importlib.metadata as md, sys
try:
    print(md.version(sys.argv[1]))
except md.PackageNotFoundError:
    pass
PY
}

# The venvs the image changes: those that carry megatron-core, or exactly
# GTP_TARGET_VENVS when set (run-local.sh --venv: a plain venv may not carry
# megatron-core yet).
megatron_venvs() {
  local v
  if [ -n "${GTP_TARGET_VENVS:-}" ]; then
    # shellcheck disable=SC2086  # a space-separated list, split on purpose
    printf '%s\n' $GTP_TARGET_VENVS
    return 0
  fi
  for v in $(all_venvs); do
    [ -n "$(dist_version "$v" megatron-core)" ] && echo "$v"
  done
  return 0
}

have_uv() { command -v uv >/dev/null 2>&1; }

# pip_install VENV ARGS...: uv when present, else the venv's own pip. uv runs
# from / with --no-config: inside the NeMo-RL checkout the workspace's
# override-dependencies (TE 2.15) would win silently.
pip_install() {
  local venv="$1"; shift
  if have_uv; then
    (cd / && uv pip install --no-config --python "$venv/bin/python" "$@")
  elif "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    "$venv/bin/python" -m pip install --no-input --disable-pip-version-check "$@"
  else
    # A venv made --without-pip: pip (>= 22.3) from outside can target it.
    python3 -m pip --python "$venv/bin/python" install --no-input --disable-pip-version-check "$@"
  fi
}

# Flags that let a venv's Python install a wheel whose Requires-Python excludes
# it (megatron-bridge 0.6.2 says <3.13; NeMo-RL runs 3.13 and overrides it too).
requires_python_override() {
  if have_uv; then echo "--python-version 3.12"; else echo "--ignore-requires-python"; fi
}

series_json() {  # series_json KEY -> value from the wheelhouse's series.json
  python3 - "$GTP_WHEELHOUSE/series.json" "$1" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for part in sys.argv[2].split("."):
    doc = doc[part]
print(doc if isinstance(doc, str) else json.dumps(doc))
PY
}
