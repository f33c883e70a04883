#!/usr/bin/env bash
# Run the gtp-te219 steps outside Docker (a GPU machine, a Slurm node, a plain
# venv), then the verify step, against a local wheelhouse.
#
#   run-local.sh --wheelhouse DIR --venv VENV [--venv VENV ...]
#                [--flavor cuda|cpu] [--te-wheelhouse DIR] [--nemo-rl DIR]
#                [--te-no-deps] [--te-torch-prebuilt SO]
#                [--cuda-archs "90"] [--max-jobs N] [--json FILE]
#
# --wheelhouse  the wheelhouse/ of a context written by
#               `tools/build_image.py gtp-te219 --flavor cuda --context-only CTX`
#               (patched wheels, series.json, image.env, nemo-rl patches)
# --venv        a venv to change (it need not carry megatron-core yet); uv is
#               used when on PATH, else the venv's own pip
# --te-wheelhouse  install TE offline from this folder: the transformer_engine_cu13
#               and transformer_engine wheels, nvidia_cudnn_frontend, TE's small
#               dependencies and the transformer_engine_torch sdist (built here)
# --te-no-deps  install the TE wheels without resolving their dependencies
#               (a staged wheelhouse that lacks e.g. nvidia-cutlass-dsl)
# --te-torch-prebuilt  use this transformer_engine_torch*.so (built against
#               the venv's torch) instead of building the extension here
# --nemo-rl     a NeMo-RL checkout at the pin to patch (default: none, skipped)
# The flavour defaults to the context's; cpu runs the TE checks only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
wheelhouse="" flavor="" venvs="" te_wh="" nemo_rl="" archs="" jobs="" json="" te_nodeps=0 te_so=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) wheelhouse="$2"; shift 2 ;;
    --venv) venvs="$venvs $(cd "$2" 2>/dev/null && pwd || echo "$2")"; shift 2 ;;
    --flavor) flavor="$2"; shift 2 ;;
    --te-wheelhouse) te_wh="$2"; shift 2 ;;
    --nemo-rl) nemo_rl="$2"; shift 2 ;;
    --te-no-deps) te_nodeps=1; shift ;;
    --te-torch-prebuilt) te_so="$2"; shift 2 ;;
    --cuda-archs) archs="$2"; shift 2 ;;
    --max-jobs) jobs="$2"; shift 2 ;;
    --json) json="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "run-local.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$wheelhouse" ] && [ -n "$venvs" ] || { echo "run-local.sh: needs --wheelhouse DIR and --venv VENV" >&2; exit 2; }
wheelhouse=$(cd "$wheelhouse" && pwd)
[ -r "$wheelhouse/image.env" ] && [ -r "$wheelhouse/series.json" ] \
  || { echo "run-local.sh: $wheelhouse lacks image.env/series.json (write it with tools/build_image.py --context-only)" >&2; exit 2; }
for v in $venvs; do
  [ -x "$v/bin/python" ] || { echo "run-local.sh: $v is not a venv (no bin/python)" >&2; exit 2; }
done

# shellcheck disable=SC1091
. "$wheelhouse/image.env"
export GTP_WHEELHOUSE="$wheelhouse" GTP_VENVS="$venvs" GTP_TARGET_VENVS="$venvs" GTP_STAND_IN_VENVS=""
[ -z "$flavor" ] || export GTP_FLAVOR="$flavor"
if [ -n "$te_wh" ]; then GTP_TE_WHEELHOUSE=$(cd "$te_wh" && pwd); export GTP_TE_WHEELHOUSE; fi
[ -z "$archs" ] || export NVTE_CUDA_ARCHS="$archs"
[ "$te_nodeps" = 0 ] || export GTP_TE_NO_DEPS=1
if [ -n "$te_so" ]; then
  GTP_TE_TORCH_PREBUILT="$(cd "$(dirname "$te_so")" && pwd)/$(basename "$te_so")"; export GTP_TE_TORCH_PREBUILT
fi
[ -z "$jobs" ] || export MAX_JOBS="$jobs"
export GTP_NEMO_RL_DIR="${nemo_rl:+$(cd "$nemo_rl" && pwd)}"
# No secrets folder outside Docker: pip and uv use this machine's own settings.
export GTP_SECRETS=/nonexistent

start=$SECONDS
for step in 10-venvs 20-te 30-megatron 40-nemo-rl; do
  t=$SECONDS
  GTP_STEP=$step bash "$here/$step.sh"
  echo "[run-local] $step done in $((SECONDS - t))s"
done
args=()
[ -z "$json" ] || args=(--json "$json")
echo "[run-local] steps done in $((SECONDS - start))s; verifying"
exec bash "$here/90-verify.sh" "${args[@]}"
