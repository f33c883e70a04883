#!/usr/bin/env bash
# Step 10: the venvs the later steps change.
#   cuda: the base (a NeMo-RL image) has them; check that some carry megatron-core.
#   cpu:  stand in for the NeMo-RL base: make a main venv and Ray worker venvs,
#         give them uv, and install the pristine pins (megatron-core,
#         megatron-bridge) from the index into the Megatron ones only.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_var GTP_FLAVOR GTP_VENVS
setup_network

case "$GTP_FLAVOR" in
  cpu)
    if [ -z "${GTP_STAND_IN_VENVS:-}" ]; then
      log "no stand-in venvs asked for (outside Docker the venvs are given)"
    fi
    if [ -n "${GTP_STAND_IN_VENVS:-}" ] && ! have_uv; then
      need_var GTP_UV_VERSION
      log "installing uv $GTP_UV_VERSION (the NeMo-RL image has it; the steps use it when present)"
      python3 -m venv /opt/gtp/uv
      /opt/gtp/uv/bin/pip install -q --no-input --disable-pip-version-check "uv==$GTP_UV_VERSION"
      ln -sf /opt/gtp/uv/bin/uv /usr/local/bin/uv
    fi
    for v in ${GTP_STAND_IN_VENVS:-}; do
      if [ ! -x "$v/bin/python" ]; then
        log "stand-in venv $v"
        # Like the NeMo-RL image: the main venv is seeded with pip, worker venvs are not.
        seed=""; case "$v" in */nemo_rl_venv) seed=--seed ;; esac
        (cd / && uv venv -q $seed --python "$(command -v python3)" "$v")
      fi
      case "$v" in
        */nemo_rl_venv|*Megatron*)
          need_var GTP_PRISTINE
          log "  pristine $GTP_PRISTINE into $v (no deps: the real base has them)"
          # shellcheck disable=SC2046,SC2086
          pip_install "$v" -q --no-deps $(requires_python_override) $GTP_PRISTINE ;;
      esac
    done
    ;;
  cuda)
    have_uv || log "no uv on PATH: installing with each venv's pip"
    ;;
  *) die "unknown flavour $GTP_FLAVOR (cpu or cuda)" ;;
esac

found=$(megatron_venvs)
[ -n "$found" ] || die "no venv in '$GTP_VENVS' carries megatron-core: is the base a NeMo-RL image?"
for v in $( (all_venvs; printf '%s\n' "$found") | sort -u); do
  if printf '%s\n' "$found" | grep -qxF "$v"; then
    log "megatron venv $v: python $("$v/bin/python" -c 'import platform; print(platform.python_version())')," \
        "megatron-core $(m=$(dist_version "$v" megatron-core); echo "${m:-none}"), torch $(t=$(dist_version "$v" torch); echo "${t:-none}")"
  else
    log "left alone (no megatron-core): $v"
  fi
done
