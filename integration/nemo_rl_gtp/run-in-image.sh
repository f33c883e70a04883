#!/usr/bin/env bash
# Run one NeMo-RL functional test and leave its evidence in OUT, for tools/nightly.py.
#
#   run-in-image.sh SCRIPT OUT
#
# SCRIPT is relative to the NeMo-RL checkout ($CARRY_NEMO_RL_ROOT), e.g.
# tests/functional/grpo_megatron_generation_gtp.sh. Runs inside the image (docker run / srun
# --container-image) or, for tests of this wrapper, on any machine.
#
# 1. Capability guard, as tests/functional/L1_Functional_Tests_Megatron_4.sh has it for GTP:
#    ask megatron-core's gtp_api.HAVE_GTP in the env the Megatron policy worker uses
#    (python-MegatronPolicyWorker in the image's frozen env, else `uv run --no-sync python`).
#    HAVE_GTP False -> one "SKIP: <script>: <reason>" line and exit 0. Unlike L1, a probe that
#    cannot even import megatron-core is a failure (exit 1), not a skip: a broken image must
#    not read as "GTP unsupported".
# 2. The test itself, as L1 runs it (`uv run --no-sync bash SCRIPT`), its exit status kept.
# 3. OUT gets run.log and metrics.json (the script's own files, from tests/functional/<name>/),
#    probe.log and exit_status.
#
# Overrides (tests of this wrapper): CARRY_GTP_PROBE (the probe's python command line) and
# CARRY_FUNCTIONAL_RUNNER (what runs SCRIPT; default "uv run --no-sync bash").
set -uo pipefail

script=${1:?usage: run-in-image.sh SCRIPT OUT}
out=${2:?usage: run-in-image.sh SCRIPT OUT}
root=${CARRY_NEMO_RL_ROOT:?set CARRY_NEMO_RL_ROOT to the NeMo-RL checkout}
name=$(basename "$script" .sh)
mkdir -p "$out"
rm -f "$out/run.log" "$out/metrics.json" "$out/exit_status"
cd "$root" || { echo "FAIL: no NeMo-RL checkout at $root"; exit 1; }
if [[ ! -f "$script" ]]; then
    echo "FAIL: $script not found in $root"
    echo 1 > "$out/exit_status"
    exit 1
fi

if [[ -n "${CARRY_GTP_PROBE:-}" ]]; then
    read -r -a probe <<< "$CARRY_GTP_PROBE"
elif command -v python-MegatronPolicyWorker > /dev/null 2>&1; then
    probe=(python-MegatronPolicyWorker)
else
    probe=(uv run --no-sync python)
fi
"${probe[@]}" -c "import megatron.core as m; from megatron.core.tensor_parallel.gtp_api import HAVE_GTP
print('megatron.core from', m.__path__[0]); print('HAVE_GTP', HAVE_GTP)" > "$out/probe.log" 2>&1
probe_rc=$?
grep "^megatron.core from " "$out/probe.log" || true
if [[ $probe_rc -ne 0 ]] || ! grep -q "^HAVE_GTP " "$out/probe.log"; then
    echo "FAIL: the GTP capability probe '${probe[*]}' did not run (exit $probe_rc):"
    tail -n 20 "$out/probe.log"
    echo 1 > "$out/exit_status"
    exit 1
fi
if ! grep -q "^HAVE_GTP True$" "$out/probe.log"; then
    echo "SKIP: $name.sh: megatron.core.tensor_parallel.gtp_api.HAVE_GTP is not True in '${probe[*]}' (GTP needs TransformerEngine >= 2.19)"
    echo 0 > "$out/exit_status"
    exit 0
fi

read -r -a runner <<< "${CARRY_FUNCTIONAL_RUNNER:-uv run --no-sync bash}"
"${runner[@]}" "./$script"
rc=$?

exp_dir="$(dirname "$script")/$name"
for f in run.log metrics.json; do
    if [[ -f "$exp_dir/$f" ]]; then
        cp -f "$exp_dir/$f" "$out/$f"
    fi
done
echo "$rc" > "$out/exit_status"
exit "$rc"
