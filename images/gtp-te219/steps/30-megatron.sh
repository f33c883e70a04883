#!/usr/bin/env bash
# Step 30: the patched megatron-core and megatron-bridge wheels (tools/apply.py
# --wheels) into every venv that carries megatron-core. They replace whatever
# the base had (NeMo-RL: editable installs of its submodules). No dependencies
# are resolved: the patched wheels need exactly what the pristine pins needed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
need_var GTP_VENVS GTP_WHEELHOUSE
[ -r "$GTP_WHEELHOUSE/series.json" ] || die "no series.json in $GTP_WHEELHOUSE (made by tools/build_image.py)"

core=$(series_json wheels.megatron-core)
bridge=$(series_json wheels.megatron-bridge)
log "series $(series_json series) digest $(series_json digest | cut -c1-12): megatron-core $core, megatron-bridge $bridge"
venvs=$(megatron_venvs)
[ -n "$venvs" ] || die "no venv carries megatron-core"
for v in $venvs; do
  log "$v"
  # The local version label carries the series digest, so a changed series is
  # always a different version: no forced reinstall needed.
  # megatron-core says Requires-Python >=3.12, and apply --wheels writes only the
  # cp312/cp313 wheels pip accepts: a venv of Python < 3.12 finds none here.
  pip_install "$v" -q --no-deps --no-index --find-links "$GTP_WHEELHOUSE" "megatron-core==$core"
  # Bridge goes where the base had it (and into venvs named explicitly).
  if [ -n "$(dist_version "$v" megatron-bridge)" ] || [ -n "${GTP_TARGET_VENVS:-}" ]; then
    # shellcheck disable=SC2046
    pip_install "$v" -q --no-deps $(requires_python_override) --no-index --find-links "$GTP_WHEELHOUSE" \
      "megatron-bridge==$bridge"
  fi
  got_core=$(dist_version "$v" megatron-core)
  got_bridge=$(dist_version "$v" megatron-bridge)
  [ "$got_core" = "$core" ] || die "$v: megatron-core is $got_core, wanted $core"
  [ -z "$got_bridge" ] || [ "$got_bridge" = "$bridge" ] || die "$v: megatron-bridge is $got_bridge, wanted $bridge"
  log "  megatron-core $got_core${got_bridge:+, megatron-bridge $got_bridge}"
done
