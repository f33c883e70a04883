# Helpers of integration/shared-gpu-h200.sh (sourced from the checkout's root; OUT set). Apart so that the
# tests can run them on a CPU (tests/test_shared_gpu.py).
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
wait_for() {  # wait_for SECONDS TEST...: until the test holds or the time is up
  local limit=$1; shift
  for _ in $(seq 1 "$limit"); do "$@" && return 0; sleep 1; done; return 1
}
alive() { [ -e "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
gone() { ! alive "$1"; }
while_setup() {  # while_setup TEST...: wait until TEST holds, as long as a setup runs here (setup-bg's, setup-pretrain's,
  # pretrain-bg's: SETUP_PIDS); its status once none runs. A wait that outlived its setup (a ferry part that never came,
  # so no payload) held the upstream tests' step, and the waits on it, until the device time ran out (2026-12-05)
  local p running
  until "$@"; do
    running=0
    for p in ${SETUP_PIDS:-/tmp/o/setup.pid /tmp/o/pretrain.pid}; do alive "$p" && running=1; done
    [ "$running" = 1 ] || { "$@"; return; }
    sleep 3
  done
}
setup_model() {  # setup_model: true once a setup here wrote its model.json, where NeMo-RL's tests read the model's
  # facts: UT_SETUP's, else setup-bg's (TOP/setup) or setup-pretrain's and pretrain-bg's (TOP/pretrain). The default had
  # been TOP/pretrain alone: after setup-bg (the documented order) NeMo-RL's tests waited for a model.json no step wrote
  local top=${UT_TOP:-/tmp/o} d
  for d in ${UT_SETUP:-$top/setup $top/pretrain}; do [ -e "$d/model.json" ] && return 0; done
  return 1
}
venv_ok() {  # venv_ok [VERIFY_JSON]: the setup's venv is there whole: its verify.json says ok (a failed setup leaves one
  # too), and the venv-ready.json beside it says the setup installed NeMo-RL's dependency wheels after it (verify.json
  # alone came first: Megatron-LM's tests started while omegaconf was still being installed, 2026-12-06)
  local v=${1:-/tmp/nrl-run/verify.json}
  [ -e "$(dirname "$v")/venv-ready.json" ] &&
    python3 -c "import json, sys; sys.exit(json.load(open(sys.argv[1])).get('ok') is not True)" "$v" 2> /dev/null
}
nrl_tests_env() {  # nrl_tests_env ROOT: the KEY=VALUE words NeMo-RL's own tests run with on this host, as its GRPO
  # cases do (harness/host/caserun.py case_env), ROOT the checkout: the stand-ins for mlflow, wandb and swanlab (its
  # conftest imports nemo_rl.utils.logger), the hooks (the shared-GPU mode in every Python, Ray's workers included:
  # each its own NCCL_HOSTID, every logical GPU id on GPU 0; CARRY_SHARED_GPU comes from the launcher), the workers
  # on this venv's Python (no uv venvs: the host has no network) and Hugging Face offline (a test that downloads
  # fails at once with its own error, not after the hub's retries). On 2026-12-05 none of this was there, and
  # test_megatron_policy_generation[2gpu_dp2_megatron] hung on both sides.
  local root=${1:?checkout}
  echo "PYTHONPATH=$root/integration/nemo_rl_gtp/stubs:$root/integration/nemo_rl_gtp/hooks" \
    NEMO_RL_PY_EXECUTABLES_SYSTEM=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 RAY_DEDUP_LOGS=0
}
wave_width() {  # wave_width TOTAL_MIB: how many learning cases one GPU of that much memory holds side by side (two
  # peaked at 127.0 GB on an H200, h200/2026-12-05-learning-at-3e-5; one alone fits an H100's 80 GB); 1 when unknown
  local mib=${1:-0}
  [[ $mib =~ ^[0-9]+$ ]] || mib=0
  if [ "$mib" -ge 133000 ]; then echo 2; else echo 1; fi
}
unpack_runs() {  # unpack_runs: each committed GPU run kept as run.tar.xz (integration/h100/*/) unpacked beside it, into
  # run/, which git ignores (carry.evidence.records: the stdlib alone, so any python3); one unpacked from the same
  # archive is left as it is. What the runs compared is read from there: a run not unpacked would count for nothing
  PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools${PYTHONPATH:+:$PYTHONPATH}" \
    python3 -m carry.evidence.records unpack integration >&2
}
committed_results() {  # committed_results UPSTREAM: the result.json of each committed GPU run of UPSTREAM's tests
  unpack_runs || return 1
  find integration/h100 integration/h200 -path "*/${1:?upstream}/result.json*" -not -path "*/bisect/*" 2>/dev/null | sort
}
compared_args() {  # compared_args UPSTREAM: tools/upstream_tests.py's arguments for where the committed GPU runs
  # stopped, NUL-separated: --compared each of their results (committed_results) and, for Megatron-LM with results
  # to name, --look-again each ;-separated TEXT of UT_MLM_LOOK_AGAIN. UT_COMPARED: all (the default), none, or the
  # upstreams that go on where their runs stopped, space-separated (the others run their whole selection again:
  # on a kind of GPU their runs have not had, say)
  local up=${1:?upstream} f text again=() n=0
  case " ${UT_COMPARED:-all} " in " all "|*" $up "*) ;; *) return 0 ;; esac
  unpack_runs || return 1   # here too: committed_results' own failure is lost in the loop's process substitution
  while IFS= read -r f; do printf '%s\0' --compared "$f"; n=$((n + 1)); done < <(committed_results "$up")
  if [ "$up" = megatron-lm ] && [ "$n" -gt 0 ] && [ -n "${UT_MLM_LOOK_AGAIN:-}" ]; then
    IFS=";" read -ra again <<< "$UT_MLM_LOOK_AGAIN"
    for text in "${again[@]}"; do [ -z "$text" ] || printf '%s\0' --look-again "$text"; done
  fi
  return 0
}
snapshot_checkout() {  # snapshot_checkout CHECKOUT ROOT: a copy of CHECKOUT under ROOT (not its ferries, venv,
  # git directory, nor a cache), a new folder each time; prints its path
  local src=${1:?checkout} root=${2:?root} dst
  mkdir -p "$root" && dst=$(mktemp -d "$root/tree-XXXXXX") || return 1
  tar -C "$src" --exclude=./.ferry --exclude=./.venv --exclude=./.git --exclude=./.cache -cf - . | tar -C "$dst" -xf - || return 1
  echo "$dst"
}
unpack_tests_ferry() {  # unpack_tests_ferry DIR: each DIR/tests/NAME.tar.xz of the "tests" ferry (recv.sh tests DIR) into
  # DIR/NAME, the folder of NAME's pinned test paths that tools/upstream_tests.py --tests-source NAME=DIR/NAME reads
  # (it checks their hashes); a folder unpacked from this very archive (its sha256 in DIR/NAME/.from-ferry) is
  # kept, one from another (an earlier ferry's) replaced. Its wheels (DIR/tests/wheels: the lock's [[tests]], what
  # those tests import that the stack lacks) installed into DIR/site (pip --target, offline, no dependency resolved:
  # the lock names each), for those tests' path alone; kept the same way
  local dir=${1:?dir} xz name sum whl
  for xz in "$dir"/tests/*.tar.xz; do
    [ -e "$xz" ] || { echo "no tests ferry in $dir/tests" >&2; return 1; }
    name=$(basename "$xz" .tar.xz); sum=$(sha256sum "$xz" | cut -d' ' -f1)
    [ "$(cat "$dir/$name/.from-ferry" 2>/dev/null)" = "$sum" ] && continue
    rm -rf "$dir/$name" "$dir/$name.part"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
      "$xz" "$dir/$name.part" && echo "$sum" > "$dir/$name.part/.from-ferry" && mv "$dir/$name.part" "$dir/$name" \
      || return 1
  done
  whl=("$dir"/tests/wheels/*.whl)
  [ -e "${whl[0]}" ] || return 0
  sum=$(cat "${whl[@]}" | sha256sum | cut -d' ' -f1)
  [ "$(cat "$dir/site/.from-ferry" 2>/dev/null)" = "$sum" ] && return 0
  rm -rf "$dir/site" "$dir/site.part"
  "${UT_PIP_PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
    --target "$dir/site.part" "${whl[@]}" && echo "$sum" > "$dir/site.part/.from-ferry" && mv "$dir/site.part" "$dir/site"
}
pack() {  # pack NAME PATH...: the small files only (logs, JSON, markdown)
  local name=$1; shift
  find "$@" -type f -size -4096k -not -path '*/nemo-rl/*' -not -path '*/megatron-from-hf/*' \
    -not -path '*/hf-datasets/*' -not -path '*/work/*' -not -path '*/trees/*' \
    \( -name '*.json' -o -name '*.log' -o -name '*.md' -o -name '*.xml' \
    -o -name '*.stdout' -o -name '*.console' -o -name '*.txt' -o -name exit_status -o -name '*.jsonl' \) 2>/dev/null \
    | tar -czf "$OUT/$name.tgz.tmp" -T - 2> /dev/null   # (find names paths that may not be there yet)
  mv -f "$OUT/$name.tgz.tmp" "$OUT/$name.tgz" && stamp "packed $OUT/$name.tgz"
}

pack_evidence() {
  pack evidence /tmp/o/evidence.log /tmp/o/gpu-mem.log /tmp/o/pretrain /tmp/o/pretrain.console /tmp/o/case-* \
    /tmp/o/queue-ray.log /tmp/nightly-learning /tmp/o/learning.console > /dev/null
}
pack_ut() {  # not the upstream trees the runs copy (trees/, bisect/k*/tree/: their README.md and JSON came back by
  # the hundred on 2026-12-04) nor the launches' whole console.log (the rank records hold every test's outcome):
  # its last 64 KB, console.tail.txt beside it, which holds the stacks a hung test's rank dumped as it ended
  # (2026-12-05: NeMo-RL's test_megatron_policy_generation[2gpu_dp2_megatron] hung on both sides, its dump not packed)
  local top=${UT_TOP:-/tmp/o} log
  [ -d "$top/ut" ] || return 0
  while IFS= read -r log; do tail -c 65536 "$log" > "${log%/*}/console.tail.txt"; done \
    < <(find "$top/ut" -type f -name console.log -not -path '*/trees/*' -not -path '*/tree/*')
  ( cd "$top" && find ut -type f -size -8000k \( -name '*.json' -o -name '*.jsonl' -o -name '*.txt' -o -name '*.log' \
    -o -name '*.md' \) -not -name console.log -not -path '*/trees/*' -not -path '*/tree/*' \
    | tar -czf "$OUT/ut.tgz.tmp" -T - ; mv -f "$OUT/ut.tgz.tmp" "$OUT/ut.tgz" )
}
wait_packing() {  # wait_packing SECONDS PIDFILE PACK...: wait for PIDFILE's process, running each PACK every
  # PACK_EVERY (default 60) s and at the end; true when it ended
  local limit=$1 pidfile=$2 left=$1 every=${PACK_EVERY:-60} chunk rc=1 p; shift 2
  while [ "$left" -gt 0 ]; do
    chunk=$((left < every ? left : every)); left=$((left - chunk))
    if wait_for "$chunk" gone "$pidfile"; then rc=0; break; fi
    for p in "$@"; do "$p"; done
  done
  for p in "$@"; do "$p"; done; stamp "packed ($*) after waiting at most $limit s"
  return $rc
}
