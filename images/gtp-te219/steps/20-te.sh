#!/usr/bin/env bash
# Step 20: TransformerEngine >= the GTP floor in every venv that carries megatron-core.
#   cuda: per venv, nvidia-cudnn-frontend at or above TE's floor first, then TE's
#         core and Python package, then the TE torch extension built against
#         that venv's torch with --no-build-isolation (one build per torch version).
#   cpu:  the checks only (versions, floors, which venvs would get TE); no TE.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_var GTP_FLAVOR GTP_VENVS GTP_TE_VERSION GTP_TE_FLOOR GTP_CUDNN_FRONTEND_FLOOR GTP_TE_CORE
setup_network

version_ge "$GTP_TE_VERSION" "$GTP_TE_FLOOR" \
  || die "TransformerEngine $GTP_TE_VERSION is below the GTP floor $GTP_TE_FLOOR"
venvs=$(megatron_venvs)
[ -n "$venvs" ] || die "no venv carries megatron-core (step 10 checks this)"
log "TE $GTP_TE_VERSION (floor $GTP_TE_FLOOR), nvidia-cudnn-frontend >= $GTP_CUDNN_FRONTEND_FLOOR, core $GTP_TE_CORE"

if [ "$GTP_FLAVOR" = cpu ]; then
  for v in $venvs; do
    te=$(dist_version "$v" transformer-engine)
    [ -z "$te" ] || die "cpu flavour: $v already has TransformerEngine $te"
    log "check only (cpu flavour): $v would get nvidia-cudnn-frontend>=$GTP_CUDNN_FRONTEND_FLOOR," \
        "transformer-engine[$GTP_TE_CORE]==$GTP_TE_VERSION and transformer-engine-torch==$GTP_TE_VERSION"
  done
  exit 0
fi
[ "$GTP_FLAVOR" = cuda ] || die "unknown flavour $GTP_FLAVOR (cpu or cuda)"
need_var NVTE_CUDA_ARCHS MAX_JOBS

src=()
if [ -n "${GTP_TE_WHEELHOUSE:-}" ]; then
  [ -d "$GTP_TE_WHEELHOUSE" ] || die "GTP_TE_WHEELHOUSE $GTP_TE_WHEELHOUSE is not a folder"
  src=(--no-index --find-links "$GTP_TE_WHEELHOUSE")
  log "installing TE offline from $GTP_TE_WHEELHOUSE"
fi
export NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS MAX_JOBS NVTE_PYTORCH_FORCE_BUILD=TRUE
build=$(mktemp -d "${TMPDIR:-/tmp}/gtp-te-build.XXXXXX")
trap 'rm -rf "$build"' EXIT

# The TE torch extension for VENV's torch: a wheel built once per torch version
# by a venv that has pip; without pip, uv builds it in place.
te_torch() {
  local venv="$1" torch key whl
  torch=$(dist_version "$venv" torch)
  [ -n "$torch" ] || die "$venv carries megatron-core but no torch"
  key="$build/torch-$torch"
  if [ ! -d "$key" ] && "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    log "  building transformer-engine-torch $GTP_TE_VERSION against torch $torch (archs $NVTE_CUDA_ARCHS, $MAX_JOBS jobs)"
    "$venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation "${src[@]}" \
      --wheel-dir "$key" "transformer-engine-torch==$GTP_TE_VERSION"
  fi
  whl=$(ls "$key"/transformer_engine_torch-*.whl 2>/dev/null | head -n 1 || true)
  if [ -n "$whl" ]; then
    pip_install "$venv" -q --no-deps "$whl"
  else
    log "  building transformer-engine-torch in $venv (no pip there)"
    pip_install "$venv" -q --no-deps --no-build-isolation "${src[@]}" "transformer-engine-torch==$GTP_TE_VERSION"
  fi
}

for v in $venvs; do
  log "$v"
  # Keep the venv's torch where it is: TE must not move it.
  pins="$build/pins.txt"
  echo "torch==$(dist_version "$v" torch)" > "$pins"
  pip_install "$v" -q "${src[@]}" -c "$pins" "nvidia-cudnn-frontend>=$GTP_CUDNN_FRONTEND_FLOOR"
  pip_install "$v" -q "${src[@]}" -c "$pins" "transformer-engine[$GTP_TE_CORE]==$GTP_TE_VERSION"
  te_torch "$v"
  te=$(dist_version "$v" transformer-engine)
  fe=$(dist_version "$v" nvidia-cudnn-frontend)
  version_ge "${te:-0}" "$GTP_TE_FLOOR" || die "$v: transformer-engine is ${te:-missing} after the install"
  version_ge "${fe:-0}" "$GTP_CUDNN_FRONTEND_FLOOR" || die "$v: nvidia-cudnn-frontend is ${fe:-missing}"
  log "  transformer-engine $te, transformer-engine-torch $(dist_version "$v" transformer-engine-torch), nvidia-cudnn-frontend $fe"
done
