#!/usr/bin/env bash
# Step 20: TransformerEngine >= the GTP floor in every venv that carries megatron-core.
#   cuda: per venv, nvidia-cudnn-frontend at or above TE's floor first, then TE's
#         core and Python package, then the TE torch extension built against
#         that venv's torch with --no-build-isolation (one build per torch version).
#   cpu:  the checks only (versions, floors, which venvs would get TE); no TE.
# Outside Docker (run-local.sh): GTP_TE_WHEELHOUSE installs offline,
# GTP_TE_NO_DEPS=1 skips resolution, GTP_TE_TORCH_PREBUILT uses a built extension.
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
deps=()
if [ "${GTP_TE_NO_DEPS:-0}" = 1 ]; then
  # A staged offline wheelhouse carries TE and its direct runtime wheels only.
  deps=(--no-deps)
  log "installing TE without resolving dependencies (GTP_TE_NO_DEPS=1)"
fi
if [ -n "${GTP_TE_WHEELHOUSE:-}" ]; then
  [ -d "$GTP_TE_WHEELHOUSE" ] || die "GTP_TE_WHEELHOUSE $GTP_TE_WHEELHOUSE is not a folder"
  src=(--no-index --find-links "$GTP_TE_WHEELHOUSE")
  log "installing TE offline from $GTP_TE_WHEELHOUSE"
fi
export NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS MAX_JOBS NVTE_PYTORCH_FORCE_BUILD=TRUE
build=$(mktemp -d -t gtp-te-build.XXXXXX)
trap 'rm -rf "$build"' EXIT

# The TE torch extension for VENV's torch: a wheel built once per torch version
# by a venv that has pip; without pip, uv builds it in place.
te_torch() {
  local venv="$1" torch key whl site
  torch=$(dist_version "$venv" torch)
  [ -n "$torch" ] || die "$venv carries megatron-core but no torch"
  if [ -n "${GTP_TE_TORCH_PREBUILT:-}" ]; then
    # Escape hatch for a machine that cannot build (shared/gpu/README.md): an
    # extension built elsewhere against this very torch, put where TE looks.
    [ -f "$GTP_TE_TORCH_PREBUILT" ] || die "GTP_TE_TORCH_PREBUILT $GTP_TE_TORCH_PREBUILT is not a file"
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$site/transformer_engine/wheel_lib"
    cp "$GTP_TE_TORCH_PREBUILT" "$site/transformer_engine/wheel_lib/"
    log "  prebuilt TE torch extension $(basename "$GTP_TE_TORCH_PREBUILT") (not built here) for torch $torch"
    return 0
  fi
  key="$build/torch-$torch"
  if [ ! -d "$key" ] && "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    log "  building transformer-engine-torch $GTP_TE_VERSION against torch $torch (archs $NVTE_CUDA_ARCHS, $MAX_JOBS jobs)"
    "$venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation "${src[@]}" \
      --wheel-dir "$key" "transformer-engine-torch==$GTP_TE_VERSION"
  fi
  whl=$(find "$key" -maxdepth 1 -name 'transformer_engine_torch-*.whl' 2>/dev/null | head -n 1)
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
  if [ "${#deps[@]}" = 0 ]; then
    pip_install "$v" -q "${src[@]}" -c "$pins" "nvidia-cudnn-frontend>=$GTP_CUDNN_FRONTEND_FLOOR"
    pip_install "$v" -q "${src[@]}" -c "$pins" "transformer-engine[$GTP_TE_CORE]==$GTP_TE_VERSION"
  else
    # Unresolved: the staged wheels are the set (TE core and package, the
    # frontend, their small runtime deps); the checks below still apply.
    [ -n "${GTP_TE_WHEELHOUSE:-}" ] || die "GTP_TE_NO_DEPS=1 needs GTP_TE_WHEELHOUSE"
    pip_install "$v" -q --no-deps --no-index "$GTP_TE_WHEELHOUSE"/*.whl
  fi
  te_torch "$v"
  te=$(dist_version "$v" transformer-engine)
  fe=$(dist_version "$v" nvidia-cudnn-frontend)
  version_ge "${te:-0}" "$GTP_TE_FLOOR" || die "$v: transformer-engine is ${te:-missing} after the install"
  version_ge "${fe:-0}" "$GTP_CUDNN_FRONTEND_FLOOR" || die "$v: nvidia-cudnn-frontend is ${fe:-missing}"
  log "  transformer-engine $te, transformer-engine-torch $(t=$(dist_version "$v" transformer-engine-torch); echo "${t:-prebuilt}"), nvidia-cudnn-frontend $fe"
done
