#!/usr/bin/env bash
# Gather the GPU evidence of the megatron-lm series on a GPU host (one or two GPUs, offline).
#
#   evidence.sh OUT [proofs] [mini] [cost] [experts] [experts-without]
#
# Needs: the pin artifacts in $CARRY_CACHE (a copy of ~/.cache/gtp-carry/artifacts under
# $CARRY_CACHE/artifacts: apply then needs no network) and TransformerEngine >= 2.19 importable
# (PYTHONPATH, e.g. /tmp/site as shared/gpu/README.md installs it).
#
# - proofs: tools/prove.py for the GPU proofs (mlm-te-bias-sizing, mlm-gtp-tied-prefetch,
#   mlm-gtp-tied-dummy-wgrad),
#   pristine vs patched; OUT/prove.json, OUT/prove.txt.
# - mini:   integration/gtp_refit_mini/run.py on the patched tree (gloo fp32 on one GPU; NCCL bf16
#   on two), on the pristine tree, and on the series without mlm-gtp-tied-prefetch, without
#   mlm-gtp-swiglu-ckpt and without mlm-gtp-refit-plan (mlm-gtp-ckpt-without-te changes nothing
#   where TE imports); then the Qwen2.5-0.5B shape patched and without mlm-gtp-tied-dummy-wgrad
#   (the tiny model's dummy buffer may happen to hold zeros); one OUT/<variant>.<form>.stdout per
#   run, exit statuses in OUT/runs.tsv.
# - cost:   the --compare-gtp-off run on the Qwen2.5-0.5B shape (nightly cell gtp-refit-mini-cost).
# - experts (not in the default set): the expert axis of issue 23. The TE grouped-expert proofs
#   (patches/gtp/proofs/megatron_lm/test_te_grouped_experts.py, by pytest: their CPU siblings are
#   proven on the CPU) on the pristine and the patched tree, OUT/experts-proofs.<tree>.txt; then
#   --shape moe-tiny over gloo (one GPU) on both trees, and over NCCL bf16 where two GPUs are.
# - experts-without: the same proofs on the series without mlm-gtp-swiglu-ckpt and without
#   mlm-gtp-refit-plan (each must fail only its own test).
# Nothing stops at a failed run: every outcome is recorded.
set -uo pipefail
out=${1:?usage: evidence.sh OUT [proofs] [mini] [cost] [experts] [experts-without]}
shift
what=${*:-proofs mini cost}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${CARRY_CACHE:?set CARRY_CACHE to a folder holding artifacts/ (the pins, hash-checked by apply)}
work=${CARRY_EVIDENCE_WORK:-/tmp/carry-evidence}
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1
py=python3
gpus=$($py -c 'import torch; print(torch.cuda.device_count())')
echo "[evidence] $(date -u +%FT%TZ) gpus=$gpus what='$what'"

ids_without() {  # the series' megatron-lm patch ids, minus $1
  $py - "$repo/patches/gtp/series.toml" "$1" <<'PY'
import sys, tomllib
doc = tomllib.load(open(sys.argv[1], "rb"))
print(",".join(p["id"] for p in doc["patches"] if p["upstream"] == "megatron-lm" and p["id"] != sys.argv[2]))
PY
}

tree() {  # tree NAME [ONLY]: a megatron-lm tree made by tools/apply.py; echoes its path
  local name=$1 only=${2:-megatron-lm}
  if [ ! -d "$work/$name/megatron-lm" ]; then
    $py "$repo/tools/apply.py" --series gtp --workdir "$work/$name" --cache "$cache" --only "$only" \
      > "$work/$name.apply.log" 2>&1 || { echo "[evidence] apply $name failed:" >&2; tail -5 "$work/$name.apply.log" >&2; }
  fi
  echo "$work/$name/megatron-lm"
}

pristine() {  # the pinned base, unpatched (the workspace's first commit)
  local ws; ws=$(tree patched)
  if [ ! -d "$work/pristine" ]; then
    mkdir -p "$work/pristine"
    git -C "$ws" archive "$(git -C "$ws" rev-list --max-parents=0 HEAD)" | tar -x -C "$work/pristine"
  fi
  echo "$work/pristine"
}

mini() {  # mini LABEL TREE FORM ARGS...: one run, its stdout kept, its exit status recorded
  local label=$1 treedir=$2 form=$3; shift 3
  local t0=$SECONDS
  PYTHONPATH="$treedir:${PYTHONPATH:-}" timeout 900 $py "$repo/integration/gtp_refit_mini/run.py" "$@" \
    > "$out/$label.$form.stdout" 2> "$work/$label.$form.stderr"
  local rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$label.$form.stdout" "$rc" "$(git -C "$treedir" rev-parse HEAD 2>/dev/null || echo pristine)" \
    "$((SECONDS - t0))" "$*" >> "$out/runs.tsv"
  echo "[evidence] $label.$form: exit $rc in $((SECONDS - t0))s: $(grep -E '^(BUG_HIT|FAIL|SKIP)' "$out/$label.$form.stdout" | head -1)"
  [ "$rc" = 0 ] || tail -n 3 "$work/$label.$form.stderr" | sed 's/^/    /'
}

case " $what " in *" proofs "*)
  tree patched > /dev/null
  $py "$repo/tools/prove.py" --series gtp --workdir "$work/patched" --only mlm-te-bias-sizing,mlm-gtp-tied-prefetch,mlm-gtp-tied-dummy-wgrad \
    --json "$out/prove.json" --logs "$work/prove-logs" --timeout 600 > "$out/prove.txt" 2>&1
  echo "[evidence] prove exit $?"; cat "$out/prove.txt"
;; esac

case " $what " in *" mini "*)
  patched=$(tree patched)
  mini patched "$patched" gloo-fp32 --nproc 2 --backend gloo
  if [ "$gpus" -ge 2 ]; then
    nccl=(--nproc 2 --backend nccl --dtype bf16 --steps 3)
    mini patched "$patched" nccl-bf16 "${nccl[@]}"
    mini pristine "$(pristine)" nccl-bf16 "${nccl[@]}"
    # mlm-gtp-ckpt-without-te changes nothing where TE is importable (its proof is the CPU one).
    for id in mlm-gtp-tied-prefetch mlm-gtp-swiglu-ckpt mlm-gtp-refit-plan; do
      mini "without-$id" "$(tree "without-$id" "$(ids_without "$id")")" nccl-bf16 "${nccl[@]}"
    done
    qwen=("${nccl[@]}" --shape qwen2.5-0.5b)
    mini patched "$patched" nccl-bf16.qwen2.5-0.5b "${qwen[@]}"
    id=mlm-gtp-tied-dummy-wgrad
    mini "without-$id" "$(tree "without-$id" "$(ids_without "$id")")" nccl-bf16.qwen2.5-0.5b "${qwen[@]}"
  fi
;; esac

experts_proofs() {  # experts_proofs LABEL TREE: the TE grouped-expert proofs on one tree
  local proofs=$repo/patches/gtp/proofs t0=$SECONDS rc
  (cd "$proofs" && PYTHONPATH="$proofs:$2:${PYTHONPATH:-}" timeout 900 $py -m pytest -q -c pytest.ini --rootdir . -rA \
    megatron_lm/test_te_grouped_experts.py) > "$out/experts-proofs.$1.txt" 2>&1
  rc=$?
  echo "[evidence] experts proofs $1: exit $rc in $((SECONDS - t0))s: $(tail -n 1 "$out/experts-proofs.$1.txt")"
}

case " $what " in *" experts "*)
  experts_proofs pristine "$(pristine)"
  experts_proofs patched "$(tree patched)"
  mini patched "$(tree patched)" moe-gloo --nproc 2 --backend gloo --shape moe-tiny
  mini pristine "$(pristine)" moe-gloo --nproc 2 --backend gloo --shape moe-tiny
  if [ "$gpus" -ge 2 ]; then
    mini patched "$(tree patched)" moe-nccl-bf16 --nproc 2 --backend nccl --dtype bf16 --steps 3 --shape moe-tiny
  fi
;; esac

case " $what " in *" experts-without "*)
  for id in mlm-gtp-swiglu-ckpt mlm-gtp-refit-plan; do
    experts_proofs "without-$id" "$(tree "without-$id" "$(ids_without "$id")")"
  done
;; esac

case " $what " in *" cost "*)
  if [ "$gpus" -ge 2 ]; then
    mini patched "$(tree patched)" cost --nproc 2 --backend nccl --dtype bf16 --compare-gtp-off --steps 4 \
      --shape qwen2.5-0.5b
  fi
;; esac
echo "[evidence] done $(date -u +%FT%TZ)"
