#!/usr/bin/env bash
# The two-rank matrix on one H200 in the shared-GPU mode, as device calls (integration/README.md,
# "Two ranks on one GPU"). Run from the checkout's root on the GPU machine, after the te ferry
# (TE in /tmp/site) and with the nrl ferry in /tmp/nrl. Each step packs what it leaves into one
# $OUT/<step>.tgz (the device returns few files).
#
#   setup-pretrain  in the background (setsid): run-on-gpu-host's setup, then the learning cases'
#                   pretrain step (/tmp/o/pretrain)
#   mini            the NCCL mini cells judged by the nightly: nccl-bf16 (Qwen2.5-0.5B shape),
#                   moe-nccl, cost
#   learning-bg     in the background: once the pretrain is done, the nightly's learning cell
#   red             the NCCL mini cells on pristine megatron-core 0.19.2, and the nccl-bf16 cell on
#                   the series without mlm-gtp-tied-dummy-wgrad, bisected
#   cost            GTP's cost (--compare-gtp-off) once more, for the spread
#   wait-learning   wait for the learning cell (at most $2 seconds), then pack it
#   case-bg NAME    in the background: one harness case (a mutation, a matrix case, moe)
#   wait-case NAME  wait for it (at most $3 seconds), then pack it; exit 3 while it still runs
#                   (case-bg refuses to start a case while another still runs: one Ray at a time)
#   setup           run-on-gpu-host's setup alone, in the foreground
#   pretrain-bg     in the background: the learning cases' pretrain step alone (after setup)
#   queue-bg NAME...  in the background: one Ray cluster of 2 x QUEUE_WIDTH logical GPUs and the
#                   harness cases in order, QUEUE_WIDTH (default 2) at a time on it (--ray-running),
#                   each learning* case only once the pretrain is done; /tmp/o/queue.log says what
#                   started and ended when
#   wait-queue S    wait (at most S seconds) for the queue, pack every case that ended, and stop the
#                   queue's Ray once all have; exit 3 while any still runs
#   stop-queue      kill the queue, its cases and its Ray
#   proofs          the GPU proofs (tools/prove.py: the patches with a CUDA proof, PROVE_ONLY to choose;
#                   their CPU-form proofs skip where TE gives HAVE_GTP) on the series, in the foreground, in the
#                   setup's venv (its TE): after the setup, or beside it (it waits for the venv)
#   learning-evidence-bg  issue 40, one command after the ferries, in the background: the setup and the
#                   pretrain step; one Ray cluster of 2 x WAVE_WIDTH (default wave_width of GPU 0's memory: 2 on an
#                   H200's 143 GB, 1 on an H100's 80 (two cases peaked at 127 GB); three learning cases filled the
#                   H200's memory, h200/2026-12-04-learning-wave1-lost) logical GPUs; wave 1, the lr recipes,
#                   WAVE_WIDTH at a time (LR_RECIPES, default cases.LR_RECIPES; "none": no wave 1, the committed
#                   LEARNING_LR, for a session whose device time does not hold both waves); the lr whose recipe's held-out
#                   gain is highest becomes LEARNING_LR in this copy's harness/host/cases.py (the value to
#                   commit); wave 2, side by side on the same cluster: the nightly's learning cell
#                   (tools/nightly.py --tests grpo-megatron-generation-gtp-learning, CARRY_NRL_RAY_RUNNING=1),
#                   then WAVE2's cases in order (default "learning-sign-flip learning-gtp-off"; the first of them beside
#                   the nightly on an H200; WAVE2= empty: the nightly's cell alone; NIGHTLY_CELL=0: WAVE2's cases alone,
#                   WAVE_WIDTH at a time, for a session that records the other halves). /tmp/o/evidence.log says what started and ended
#                   when, /tmp/o/gpu-mem.log the GPU's memory every 20 s. Beside upstream-tests-bg: after the pretrain
#                   it waits for those tests at most UT_GRACE s (default 240) and stops their Ray cluster. CASE_TIMEOUT
#                   (default 1500) bounds each learning case
#   wait-learning-evidence S  wait (at most S seconds), pack all there is so far; exit 3 while it still runs
#   upstream-tests-bg  issue 39, in the background once the setup's venv is there: each upstream's own
#                   tests (tools/upstream_tests.py) pristine against patched, the three upstreams side by side,
#                   in the setup's venv as it is (pytest, TE and the rest come with NeMo-RL's stack),
#                   the Megatron-LM and Megatron-Bridge tests from the tests ferry (stage --tests-source; bash .ferry/recv.sh
#                   tests /tmp/ut-src), NeMo-RL's from its tree;
#                   UT_BUDGET seconds per side (default 600); UT_ONLY the upstreams (default all three),
#                   UT_MLM_FILES / UT_BRIDGE_FILES / UT_NRL_FILES what runs of theirs (default: every selected file;
#                   UT_MLM_FILES takes several paths, space-separated: the eight largest files left by --select-only's
#                   standing, 500 compared in 850 s a side, two shards, h100/2026-12-07-get-batch), UT_SETUP the setup's out folder (NeMo-RL's tests wait for its model.json; default setup-bg's or the pretrain's, whichever writes one);
#                   UT_MLM_SHARDS=K (default 1): Megatron-LM's files in K parts run side by side (--shard I/K, each its own
#                   workspace and out folder ut/megatron-lm, ut/megatron-lm-2, ...: one part leaves most of the host's cores idle;
#                   but two parts of two sides at eight ranks are 32 processes on one GPU: out of memory and EAGAIN made
#                   six tests flaky or unconfirmed in h100/2026-12-07-eight-ranks, so files of eight-rank tests take one:
#                   --select-only's column says which, "55 ask for 8 ranks"; two shards of 34 files in
#                   h100/2026-12-07-small-files had 242 such tests left unreached, the eight-rank launches' start-up
#                   118 to 124 s under that load);
#                   0 with UT_MLM_BISECT_AGAIN: no part runs, only that bisection (a short session's device time);
#                   the files a committed GPU run (integration/h100, h200) compared whole on this very series stay out
#                   (tools/upstream_tests.py --compared; UT_COMPARED=none: run them again; UT_COMPARED=megatron-lm: only
#                   Megatron-LM's, the others' whole selections run again); UT_TEST_TIMEOUT the seconds a test may run
#                   (default 120: a hung collective must not take the budget); UT_ONE_SIDE=1 runs the pristine side, then the
#                   patched (--one-side-at-a-time; default 0: both at once): half the processes on the GPU, for the tests whose
#                   side ran out of its memory beside the other's (no verdict: verdict.no_verdict; 16 processes of two sides at
#                   eight ranks, h100/2026-12-07-moe-and-optimizer-files), at twice the wall time; UT_BISECT_BUDGET the seconds the bisection's
#                   probes share after the sides (default 240: the regressions first; what it does not reach stays unbisected);
#                   UT_MLM_BISECT_AGAIN=RESULT: a committed Megatron-LM result.json whose
#                   bisection its budget cut, bisected again beside the shards (--bisect-again: no side runs; out folder
#                   megatron-lm-bisect; UT_MLM_BISECT_AGAIN_BUDGET its probes' seconds, default UT_BISECT_BUDGET: it
#                   starts with the shards, so it may take as long as their sides; h100/2026-12-06-first-of-kind's dataset kinds need about 5 probes of 45 s each, and
#                   300 s beside two shards reached 4 of them, 55 to 71 s each, h100/2026-12-07-builder-bisected, and
#                   as many again in h100/2026-12-07-get-batch: each run begins again with the patched trees and the
#                   base, so the kinds left need a session's bisection alone (UT_MLM_SHARDS=0) or a longer
#                   UT_BISECT_BUDGET; it replaces UT_MLM_AGAIN, which first-of-kind used to run data/test_builder.py
#                   again whole);
#                   UT_MLM_LOOK_AGAIN='TEXT;TEXT'
#                   runs again the committed runs' Megatron-LM known failures whose first error line holds a TEXT (--look-again:
#                   the host has what they lacked since, e.g. 'async def functions are not natively supported')
#                   Pace (one H100, 2026-12-05, h100/2026-12-05-shards): one of two shards compared 391 tests in 1,250 s per
#                   side; a file whose tests time out (resharding/test_model_swap.py) ends a launch each time, about 200 s;
#                   15 of those launches waited out the 120 s per-test timeout for ranks a peer had left behind, which the
#                   launcher now stops 30 s after the peer's failure (step.Watch). Three shards (one H100, 2026-12-06,
#                   h100/2026-12-06-mlm-three-shards): 326 and 215 compared in 1,050 s per side, the GPU's 80 GB full at
#                   times (out-of-memory flakes) and a load of 30 to 40 on 16 cores: two shards suit an H100
#                   Two shards, Megatron-LM alone (UT_ONLY=megatron-lm, one H100, h100/2026-12-06-mlm-passed-over): 384 and
#                   184 compared in 752 s per side, besides 543 tests passed over (--compared, test by test); with the
#                   session's whole device time (UT_BUDGET=1250, h100/2026-12-06-mlm-whole-budget): 731 and 1,507;
#                   the slow files left then, 153 and 88 (h100/2026-12-06-data-helpers: most of each launch's start-up
#                   is imports, 36 to 47 s, and a launch ends at each hung or dead rank). That run's dataset tests failed
#                   for the wheel's compiled helpers the trees lacked (the tool puts them in since): the next run adds
#                   'SystemExit: 1' to UT_MLM_LOOK_AGAIN
#   setup-bg        in the background: run-on-gpu-host's setup alone (/tmp/o/setup)
#   wait-upstream-tests S  wait (at most S seconds), pack; exit 3 while any still runs
# Device time (one H200, 2026-12-04): 16 ferry calls of about 3.5 s (parts of 30 MiB: a call carries the
# checkout too, 64 MB in all (written 64 MiB: 64.7 MB was refused, 2026-12-06); stage without --part-mib sizes the parts to the tree as it is: on 2026-12-05 the tree
# had grown to 38 MiB, each call with a 30 MiB part was refused, and the waits after them spent the session; with the
# evidence's files over 20 KB gzipped the tree is 16.9 MB: parts of 45 MiB, 12 calls for the tests, te and nrl ferries;
# by 2026-12-07 the runs' records had grown it to 37.6 MB again: parts of 18 MiB, 29 calls of 10 to 25 s that day, one
# machine lost between two batches of them; each h100 run's run/ is now its run.tar.xz, 16 MB the tree), 376 to 473 s of setup and pretrain (535 s beside Megatron-LM's tests, the GPU at
# 88 GB then: h200/2026-12-04-beyond-gtp-folder), about 1,020 s for a wave of two learning cases at NeMo-RL's
# recipe's shape (h200/2026-12-05-learning-at-3e-5: 462 s of setup and pretrain, steps of 92 to 121 s, 127 GB at
# the peak); one session's 1,800 s holds one wave and no more (NIGHTLY_CELL=0 put learning-gtp-off and learning-sign-flip in one: 352 s, then 688 s for the two, h200/2026-12-05-learning-other-halves). Send the waits
# in the same batch of calls as the ferries and the start: a machine idle for 30 s goes back with everything under
# /tmp, and a new turn between two calls took two minutes twice on 2026-12-04 (two machines lost so, each with its
# learning wave). A machine can also be taken back for other work during a call: on 2026-12-04 the files the wait
# had packed (once a minute) came back; on 2026-12-05 nothing did, and a 540 s wait lost 253 s of device time with
# the run. So wait in calls of at most about 240 s: each returns what ended so far (the ranks' records judge a run
# cut short: h200/2026-12-05-nemo-rl-tests). Bridge's whole selection took 3 minutes from setup-bg, both sides at
# once (h100/2026-12-06-bridge-tests). But send the first ferry call alone, and the rest only once it
# answered with a machine: while none can start, every call of a batch is refused at 15 s of device time each
# (2026-12-05: a batch of 21 cost 466 s; h100/2026-12-05-upstream-tests).
set -uo pipefail
cd "$(dirname "$0")/.."
# A step that leaves work running in the background runs from a snapshot of the checkout (snapshot_checkout,
# shared-gpu-lib.sh): each later device call copies the checkout in again, and a process that imports a module
# while that copy is made finds it missing (h100/2026-12-05-upstream-tests/resynced: both applies of the
# upstream tests failed so). An edit a step makes to its copy (LEARNING_LR in cases.py) is kept there too.
case ${1:-} in
  *-bg|setup-pretrain)
    if [ -z "${CARRY_SNAPSHOT:-}" ]; then
      . integration/shared-gpu-lib.sh
      snap=$(snapshot_checkout . "${CARRY_TREES:-/tmp/carry-trees}") || { echo "cannot snapshot the checkout" >&2; exit 1; }
      CARRY_SNAPSHOT=$snap exec bash "$snap/integration/shared-gpu-h200.sh" "$@"
    fi ;;
esac
S=/tmp/nrl-run/payload/sources
MC=$S/megatron_core-0.19.2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
MB=$S/megatron_bridge-0.6.2-py3-none-any.whl
SRC=(--source "megatron-lm=$MC" --source "megatron-bridge=$MB")
export GTP_CARRY_VERBOSE=1 PYTHONUNBUFFERED=1
mkdir -p /tmp/o
OUT=${OUT:-/tmp/o/out}; mkdir -p "$OUT"

. integration/shared-gpu-lib.sh   # stamp, wait_for, alive, pack, wait_packing

case ${1:?step} in
  setup-pretrain)
    setsid nohup python3 integration/nemo_rl_gtp/run-on-gpu-host --pretrain-only --out /tmp/o/pretrain \
      > /tmp/o/pretrain.console 2>&1 < /dev/null &
    echo $! > /tmp/o/pretrain.pid; stamp "setup + pretrain started (pid $!)" ;;
  mini)
    wait_for 300 test -e /tmp/nrl-run/.payload-ok || { stamp "no payload unpacked"; exit 1; }
    stamp "mini cells"
    timeout -k 10 540 python3 tools/nightly.py --images host --shared-gpu --te-site /tmp/site --no-bisect \
      --only megatron-lm,megatron-bridge --tests gtp-refit-mini-nccl-bf16,gtp-refit-mini-moe-nccl,gtp-refit-mini-cost \
      "${SRC[@]}" --cache /tmp/carry-cache --out /tmp/nightly-mini > /tmp/nightly-mini.console 2>&1
    stamp "nightly exit $?"; cat /tmp/nightly-mini.console | tail -20
    pack mini /tmp/nightly-mini /tmp/nightly-mini.console /tmp/o/pretrain.console /tmp/o/pretrain ;;
  learning-bg)
    setsid nohup bash -c '
      . integration/shared-gpu-lib.sh   # stamp and alive, as the steps here use them
      while alive /tmp/o/pretrain.pid; do sleep 2; done
      stamp "pretrain done; the learning cell"
      CARRY_NRL_CASE_TIMEOUT=840 python3 tools/nightly.py --images gpu-host --shared-gpu --no-bisect --timeout 900 \
        --tests grpo-megatron-generation-gtp-learning "$@" --source nemo-rl='"$S"'/nemo-rl.git \
        --cache /tmp/nrl-run/carry-cache --out /tmp/nightly-learning
      rc=$?; stamp "learning nightly exit $rc"' learning "${SRC[@]}" \
      > /tmp/o/learning.console 2>&1 < /dev/null &
    echo $! > /tmp/o/learning.pid; stamp "learning cell queued (pid $!)" ;;
  red)
    rm -rf /tmp/pristine-mcore && mkdir -p /tmp/pristine-mcore && python3 -m zipfile -e "$MC" /tmp/pristine-mcore
    mkdir -p /tmp/o/red
    for shape in qwen2.5-0.5b moe-tiny; do
      stamp "pristine megatron-core, --shape $shape"
      PYTHONPATH=/tmp/pristine-mcore:/tmp/site timeout -k 10 240 python3 integration/gtp_refit_mini/run.py \
        --nproc 2 --backend nccl --dtype bf16 --steps 3 --shape "$shape" --shared-gpu --seed 1234 \
        > "/tmp/o/red/pristine.$shape.stdout" 2>&1
      stamp "exit $?"; grep -E "^(BUG_HIT|FAIL|SKIP)" "/tmp/o/red/pristine.$shape.stdout" | head -3
    done
    stamp "the series without mlm-gtp-tied-dummy-wgrad, bisected"
    timeout -k 10 420 python3 tools/nightly.py --images host --shared-gpu --te-site /tmp/site \
      --only mlm-pg-collection,mlm-inference-pg,mlm-tied-weight-guard,mlm-te-bias-sizing,mlm-gtp-tied-prefetch,mlm-gtp-ckpt-without-te,mlm-gtp-swiglu-ckpt,mlm-gtp-refit-plan,mlm-dataset-helpers-wheel \
      --tests gtp-refit-mini-nccl-bf16 "${SRC[@]}" --cache /tmp/carry-cache --out /tmp/nightly-bisect \
      > /tmp/nightly-bisect.console 2>&1
    stamp "nightly exit $?"; tail -8 /tmp/nightly-bisect.console
    pack red /tmp/o/red /tmp/nightly-bisect /tmp/nightly-bisect.console /tmp/o/learning.console ;;
  cost)
    stamp "GTP's cost, second run"
    PYTHONPATH=/tmp/nightly-mini/work/gtp/megatron-lm:/tmp/site timeout -k 10 400 python3 \
      integration/gtp_refit_mini/run.py --nproc 2 --backend nccl --dtype bf16 --compare-gtp-off --steps 4 \
      --shape qwen2.5-0.5b --shared-gpu --seed 4321 > /tmp/o/cost2.stdout 2>&1
    stamp "exit $?"; tail -c 1500 /tmp/o/cost2.stdout
    pack cost /tmp/o/cost2.stdout ;;
  wait-learning)
    done=0; wait_for "${2:-540}" gone /tmp/o/learning.pid && done=1
    stamp "learning: $(tail -1 /tmp/o/learning.console)"
    tail -25 /tmp/o/learning.console
    pack learning /tmp/nightly-learning /tmp/o/learning.console
    if [ "$done" = 0 ]; then stamp "the learning cell still runs: wait-learning again in the next call"; exit 3; fi ;;
  case-bg)
    name=${2:?case}
    for pid in /tmp/o/*.pid; do   # one case at a time: each starts and stops its own Ray
      if alive "$pid"; then stamp "refused: $pid still runs; wait for it first"; exit 1; fi
    done
    setsid nohup env CARRY_NRL_CASE_TIMEOUT=840 python3 integration/nemo_rl_gtp/run-on-gpu-host --skip-setup \
      --shared-gpu --cases "$name" --out "/tmp/o/case-$name" > "/tmp/o/case-$name.console" 2>&1 < /dev/null &
    echo $! > "/tmp/o/case-$name.pid"; stamp "case $name started (pid $!)" ;;
  wait-case)
    name=${2:?case}
    done=0; wait_for "${3:-540}" gone "/tmp/o/case-$name.pid" && done=1
    tail -5 "/tmp/o/case-$name.console"
    pack "case-$name" "/tmp/o/case-$name" "/tmp/o/case-$name.console"
    if [ "$done" = 0 ]; then stamp "case $name still runs: wait-case again in the next call"; exit 3; fi ;;
  setup-bg)
    setsid nohup python3 integration/nemo_rl_gtp/run-on-gpu-host --setup-only --out /tmp/o/setup \
      > /tmp/o/setup.console 2>&1 < /dev/null &
    echo $! > /tmp/o/setup.pid; stamp "setup started (pid $!)" ;;
  setup)
    stamp "setup"
    timeout -k 10 500 python3 integration/nemo_rl_gtp/run-on-gpu-host --setup-only --out /tmp/o/setup \
      > /tmp/o/setup.console 2>&1 < /dev/null
    rc=$?; stamp "setup exit $rc"; tail -4 /tmp/o/setup.console; exit $rc ;;
  pretrain-bg)
    setsid nohup python3 integration/nemo_rl_gtp/run-on-gpu-host --skip-setup --pretrain-only --out /tmp/o/pretrain \
      > /tmp/o/pretrain.console 2>&1 < /dev/null &
    echo $! > /tmp/o/pretrain.pid; stamp "pretrain started (pid $!)" ;;
  queue-bg)
    shift
    for pid in /tmp/o/case-*.pid /tmp/o/queue.pid; do
      if alive "$pid"; then stamp "refused: $pid still runs"; exit 1; fi
    done
    # In its own session (setsid -w waits for it): Ray's daemons in the call's session end with the call.
    width=${QUEUE_WIDTH:-2}
    case $width in [1-4]) ;; *) stamp "QUEUE_WIDTH=$width: 1 to 4 cases at a time"; exit 2 ;; esac
    export QUEUE_WIDTH=$width   # the queue's loop below reads it
    setsid -w env -u CUDA_VISIBLE_DEVICES RAY_USAGE_STATS_ENABLED=0 /tmp/nrl-run/venv/bin/ray start --head --num-gpus=$((2 * width)) \
      --include-dashboard=false --disable-usage-stats > /tmp/o/queue-ray.log 2>&1 \
      || { stamp "ray start failed"; tail -5 /tmp/o/queue-ray.log; exit 1; }
    setsid nohup bash -c '
      . integration/shared-gpu-lib.sh   # stamp and alive, as the steps here use them
      running() { n=0; for c in "$@"; do alive /tmp/o/case-$c.pid && n=$((n+1)); done; echo $n; }
      for name in "$@"; do
        while [ "$(running "$@")" -ge "$QUEUE_WIDTH" ]; do sleep 2; done
        case $name in learning*) while alive /tmp/o/pretrain.pid; do sleep 2; done ;; esac
        setsid nohup env CARRY_NRL_CASE_TIMEOUT=840 python3 integration/nemo_rl_gtp/run-on-gpu-host --skip-setup \
          --shared-gpu --ray-running --cases "$name" --out "/tmp/o/case-$name" > "/tmp/o/case-$name.console" 2>&1 < /dev/null &
        echo $! > "/tmp/o/case-$name.pid"; stamp "started $name (pid $!)"
        sleep 20   # the two side by side start their drivers and placement groups apart
      done
      while [ "$(running "$@")" -gt 0 ]; do sleep 2; done
      stamp "queue done"' queue "$@" > /tmp/o/queue.log 2>&1 < /dev/null &
    echo $! > /tmp/o/queue.pid; echo "$*" > /tmp/o/queue.names; stamp "queue started (pid $!): $*" ;;
  stop-queue)   # the queue, its running cases and its Ray, now
    for pid in /tmp/o/queue.pid /tmp/o/case-*.pid; do alive "$pid" && kill -- -"$(cat "$pid")" 2>/dev/null; done
    sleep 3; /tmp/nrl-run/venv/bin/ray stop --force > /dev/null 2>&1; stamp "queue stopped" ;;
  wait-queue)
    done=0; wait_for "${2:-540}" gone /tmp/o/queue.pid && done=1
    cat /tmp/o/queue.log
    for name in $(cat /tmp/o/queue.names); do
      if [ -e "/tmp/o/case-$name.pid" ] && ! alive "/tmp/o/case-$name.pid"; then
        tail -3 "/tmp/o/case-$name.console"; pack "case-$name" "/tmp/o/case-$name" "/tmp/o/case-$name.console"
      fi
    done
    pack queue /tmp/o/queue.log /tmp/o/queue-ray.log /tmp/o/pretrain /tmp/o/pretrain.console /tmp/o/setup.console /tmp/o/setup
    if [ "$done" = 0 ]; then stamp "the queue still runs: wait-queue again in the next call"; exit 3; fi
    /tmp/nrl-run/venv/bin/ray stop --force > /dev/null 2>&1; stamp "queue done; its Ray stopped" ;;
  proofs)
    # In the setup's venv, where its step 20 installed TransformerEngine (the te ferry holds wheels, no site to
    # point --te-site at): wait for that venv (at most 420 s) when a setup runs beside; the series' bases come
    # from the nrl ferry's sources it unpacked.
    wait_for 420 venv_ok || { stamp "no setup venv that verified ok with its wheels in (/tmp/nrl-run/verify.json, venv-ready.json): run the setup"; exit 1; }
    V=/tmp/nrl-run/venv/bin/python
    stamp "GPU proofs"
    "$V" tools/apply.py --series gtp --workdir /tmp/prove-work --only megatron-lm "${SRC[@]}" \
      --cache /tmp/carry-cache > /tmp/o/prove-apply.txt 2>&1 || { stamp "apply failed"; tail -5 /tmp/o/prove-apply.txt; exit 1; }
    timeout -k 10 540 "$V" tools/prove.py --series gtp --workdir /tmp/prove-work \
      --only "${PROVE_ONLY:-mlm-te-bias-sizing,mlm-gtp-tied-prefetch,mlm-gtp-tied-dummy-wgrad,mlm-gtp-swiglu-ckpt,mlm-gtp-refit-plan}" \
      --cache /tmp/carry-cache \
      --json /tmp/o/prove-gpu.json --logs /tmp/o/prove-logs --timeout 500 > /tmp/o/prove-gpu.txt 2>&1
    stamp "prove exit $?"; tail -15 /tmp/o/prove-gpu.txt
    pack proofs /tmp/o/prove-apply.txt /tmp/o/prove-gpu.txt /tmp/o/prove-gpu.json /tmp/o/prove-logs ;;
  learning-evidence-bg)
    for pid in /tmp/o/*.pid; do   # the upstream tests may run beside it (it waits for their Ray cluster)
      [ "$pid" = /tmp/o/ut.pid ] && continue
      if alive "$pid"; then stamp "refused: $pid still runs"; exit 1; fi
    done
    # Two learning cases side by side took about 720 s each (h200/2026-12-04-gtp-folder-learning-cut: 80 s of worker
    # setup, 140 s of CUDA-graph capture, two 22 s validations, six steps of about 67 s): 840 s was too tight.
    recipes=$(cd integration/nemo_rl_gtp && python3 -c "from harness.host import cases; print(*cases.LR_RECIPES)") \
      || { stamp "cannot read the lr recipes from cases.py"; exit 1; }
    export WAVE_WIDTH=${WAVE_WIDTH:-$(wave_width "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null)")} LR_RECIPES=${LR_RECIPES:-$recipes} CASE_TIMEOUT=${CASE_TIMEOUT:-1500} WAVE2=${WAVE2-learning-sign-flip learning-gtp-off} NIGHTLY_CELL=${NIGHTLY_CELL:-1} S
    case $NIGHTLY_CELL in 0|1) ;; *) stamp "refused: NIGHTLY_CELL is 0 or 1, not '$NIGHTLY_CELL'"; exit 2 ;; esac
    if [ "$NIGHTLY_CELL" = 0 ] && [ -z "$WAVE2" ]; then stamp "refused: NIGHTLY_CELL=0 with an empty WAVE2 runs nothing"; exit 2; fi
    setsid nohup bash -c '
      . integration/shared-gpu-lib.sh   # stamp and alive, as the steps here use them
      ( while :; do echo "$(date -u +%H:%M:%S) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"; sleep 20; done ) \
        > /tmp/o/gpu-mem.log 2>&1 &
      mem=$!; trap "kill $mem 2>/dev/null" EXIT
      running() { local n=0 c; for c in "$@"; do alive "/tmp/o/case-$c.pid" && n=$((n+1)); done; echo $n; }
      side_by_side() {  # the harness cases NAMES..., WAVE_WIDTH at a time on the running cluster, 20 s apart
        local name; for name in "$@"; do
          while [ "$(running "$@")" -ge "$WAVE_WIDTH" ]; do sleep 2; done
          setsid nohup env CARRY_NRL_CASE_TIMEOUT=$CASE_TIMEOUT python3 integration/nemo_rl_gtp/run-on-gpu-host --skip-setup \
            --shared-gpu --ray-running --cases "$name" --out "/tmp/o/case-$name" > "/tmp/o/case-$name.console" 2>&1 < /dev/null &
          echo $! > "/tmp/o/case-$name.pid"; stamp "started $name (pid $!)"; sleep 20
        done
        for name in "$@"; do
          while alive "/tmp/o/case-$name.pid"; do sleep 2; done; stamp "ended $name: $(tail -1 /tmp/o/case-$name.console)"
        done
      }
      python3 integration/nemo_rl_gtp/run-on-gpu-host --pretrain-only --out /tmp/o/pretrain > /tmp/o/pretrain.console 2>&1
      rc=$?; stamp "setup + pretrain exit $rc"; [ "$rc" = 0 ] || exit "$rc"
      # upstream-tests-bg beside it starts a Ray cluster for NeMo-RL'"'"'s tests on the default port, where this
      # one goes: wait for those tests (at most UT_GRACE s), then stop that cluster before starting this one
      for _ in $(seq 1 "${UT_GRACE:-240}"); do alive /tmp/o/ut.pid || break; sleep 1; done
      if /tmp/nrl-run/venv/bin/ray status > /dev/null 2>&1; then
        stamp "a Ray cluster runs here (the upstream tests'"'"'; they $(alive /tmp/o/ut.pid && echo "still run" || echo "ended")): stopped"
        /tmp/nrl-run/venv/bin/ray stop --force > /dev/null 2>&1
      fi
      setsid -w env -u CUDA_VISIBLE_DEVICES RAY_USAGE_STATS_ENABLED=0 /tmp/nrl-run/venv/bin/ray start --head \
        --num-gpus=$((2 * WAVE_WIDTH)) --include-dashboard=false --disable-usage-stats > /tmp/o/queue-ray.log 2>&1 \
        || { stamp "ray start failed"; exit 1; }
      if [ "$LR_RECIPES" = none ]; then   # no wave 1: the lr cases.py holds
        lr=$(python3 -c "import sys; sys.path[:0] = [\"integration/nemo_rl_gtp\", \"tools\"]
from harness.host import cases; print(cases.LEARNING_LR)")
        stamp "no wave 1 (LR_RECIPES=none): the committed LEARNING_LR, $lr"
      else
      stamp "wave 1: the lr recipes $LR_RECIPES"
      side_by_side $(for lr in $LR_RECIPES; do echo "learning-lr$lr"; done)
      lr=$(cd integration/nemo_rl_gtp && PYTHONPATH=../../tools python3 -m harness.host.learning best-lr /tmp/o $LR_RECIPES)
      [ -n "$lr" ] || { stamp "no recipe measured a gain: no wave 2"; /tmp/nrl-run/venv/bin/ray stop --force > /dev/null 2>&1; exit 1; }
      sed -i "s/^LEARNING_LR = .*/LEARNING_LR = \"$lr\"   # measured: the highest held-out gain of wave 1/" \
        integration/nemo_rl_gtp/harness/host/cases.py
      fi
      if [ "$NIGHTLY_CELL" = 0 ]; then   # the other halves alone: every slot of the wave is theirs
        stamp "wave 2 at lr $lr: $WAVE2 (NIGHTLY_CELL=0: no nightly learning cell)"
        side_by_side $WAVE2
      else   # the nightly learning cell, and WAVE2 beside it or after it
        stamp "wave 2 at lr $lr: the nightly learning cell, then $WAVE2"
        ( CARRY_NRL_RAY_RUNNING=1 CARRY_NRL_CASE_TIMEOUT=$CASE_TIMEOUT python3 tools/nightly.py --images gpu-host --shared-gpu \
            --no-bisect --timeout $((CASE_TIMEOUT + 60)) --tests grpo-megatron-generation-gtp-learning "$@" --source nemo-rl="$S"/nemo-rl.git \
            --cache /tmp/nrl-run/carry-cache --out /tmp/nightly-learning > /tmp/o/learning.console 2>&1
          stamp "learning nightly exit $?" ) &
        nightly=$!; sleep 20
        if [ "$WAVE_WIDTH" -gt 1 ]; then   # the nightly is one of the wave
          WAVE_WIDTH=$((WAVE_WIDTH - 1)) side_by_side $WAVE2
        else   # one case at a time (a GPU that holds one): the nightly first, then the others
          wait "$nightly"; side_by_side $WAVE2
        fi
        wait "$nightly"
      fi
      /tmp/nrl-run/venv/bin/ray stop --force > /dev/null 2>&1; stamp "evidence done; Ray stopped"' evidence "${SRC[@]}" \
      > /tmp/o/evidence.log 2>&1 < /dev/null &
    echo $! > /tmp/o/evidence.pid; stamp "learning evidence started (pid $!)" ;;
  wait-learning-evidence)
    # Packed once a minute while it waits, the upstream tests' files too: a call cut short by the device time
    # running out still brings back what there was a minute before.
    if wait_packing "${2:-540}" /tmp/o/evidence.pid pack_evidence pack_ut; then done=1; else done=0; fi
    cat /tmp/o/evidence.log; tail -3 /tmp/o/gpu-mem.log
    if [ "$done" = 0 ]; then stamp "the evidence still runs: wait-learning-evidence again"; exit 3; fi ;;
  upstream-tests-bg)
    export S UT_BUDGET=${UT_BUDGET:-600} UT_ONLY=${UT_ONLY:-"megatron-lm megatron-bridge nemo-rl"} \
      UT_MLM_FILES=${UT_MLM_FILES:-} UT_MLM_BISECT_AGAIN=${UT_MLM_BISECT_AGAIN:-} UT_BRIDGE_FILES=${UT_BRIDGE_FILES:-} UT_MLM_SHARDS=${UT_MLM_SHARDS:-1} \
      UT_SETUP=${UT_SETUP:-} UT_MLM_LOOK_AGAIN=${UT_MLM_LOOK_AGAIN:-} UT_TEST_TIMEOUT=${UT_TEST_TIMEOUT:-120} \
      UT_BISECT_BUDGET=${UT_BISECT_BUDGET:-240} UT_ONE_SIDE=${UT_ONE_SIDE:-0}
    export UT_MLM_BISECT_AGAIN_BUDGET=${UT_MLM_BISECT_AGAIN_BUDGET:-$UT_BISECT_BUDGET}
    case $UT_MLM_SHARDS in [0-9]) ;; *) stamp "refused: UT_MLM_SHARDS is 0 to 9, not '$UT_MLM_SHARDS'"; exit 2 ;; esac
    [ "$UT_MLM_SHARDS" != 0 ] || [ -n "$UT_MLM_BISECT_AGAIN" ] || {
      stamp "refused: UT_MLM_SHARDS is 1 to 9 without UT_MLM_BISECT_AGAIN, not '0'"; exit 2; }
    [[ $UT_TEST_TIMEOUT =~ ^[1-9][0-9]*$ ]] || { stamp "refused: UT_TEST_TIMEOUT is whole seconds, not '$UT_TEST_TIMEOUT'"; exit 2; }
    case $UT_ONE_SIDE in 0|1) ;; *) stamp "refused: UT_ONE_SIDE is 0 or 1, not '$UT_ONE_SIDE'"; exit 2 ;; esac
    [[ $UT_BISECT_BUDGET =~ ^[1-9][0-9]*$ ]] || { stamp "refused: UT_BISECT_BUDGET is whole seconds, not '$UT_BISECT_BUDGET'"; exit 2; }
    [[ $UT_MLM_BISECT_AGAIN_BUDGET =~ ^[1-9][0-9]*$ ]] || {
      stamp "refused: UT_MLM_BISECT_AGAIN_BUDGET is whole seconds, not '$UT_MLM_BISECT_AGAIN_BUDGET'"; exit 2; }
    mkdir -p /tmp/o/ut
    setsid nohup bash -c '
      . integration/shared-gpu-lib.sh   # stamp; setup_model; venv_ok: the setup'"'"'s venv, with TE and megatron-bridge'"'"'s deps; nrl_tests_env; compared_args; unpack_tests_ferry
      P=/tmp/ut-src; U=/tmp/o/ut; V=/tmp/nrl-run/venv/bin/python
      case " $UT_ONLY " in *" megatron-lm "*|*" megatron-bridge "*) unpack_tests_ferry "$P" || stamp "the tests ferry did not unpack whole in $P (its archives or its wheels: the lines above)" ;; esac
      # the committed runs, kept as run.tar.xz: unpacked before anything reads what they compared (--compared)
      unpack_runs || { stamp "the committed runs did not unpack (integration/h100/*/run.tar.xz: the lines above): nothing they compared would stay out"; exit 1; }
      # the setup unpacks the sources first, then builds the venv; none running, or one that ended without them, ends this
      while_setup test -e /tmp/nrl-run/.payload-ok || { stamp "no payload in /tmp/nrl-run and no setup running (setup-bg first; /tmp/o/setup.console)"; exit 1; }
      shards=(); case " $UT_ONLY " in *" megatron-lm "*) for i in $(seq 2 "$UT_MLM_SHARDS"); do shards+=("megatron-lm-$i"); done
        [ -z "$UT_MLM_BISECT_AGAIN" ] || shards+=(megatron-lm-bisect) ;; esac
      for up in $UT_ONLY "${shards[@]}"; do   # a workspace each: a run locks its own
        [ "$up" = megatron-lm ] && [ "$UT_MLM_SHARDS" = 0 ] && continue   # no part runs: the bisection'"'"'s alone
        u=${up%-bisect}; python3 tools/apply.py --series gtp --workdir "/tmp/ut-work/$up" --only "${u%-[0-9]}" "$@" \
          --source nemo-rl="$S"/nemo-rl.git --cache /tmp/ut-cache > "$U/apply-$up.txt" 2>&1 || stamp "apply $up failed"
      done
      stamp "workspaces applied; waiting for the setup venv"
      while_setup venv_ok || { stamp "no setup venv that verified ok and no setup running (/tmp/o/setup.console)"; exit 1; }
      "$V" -m pip freeze > "$U/environment.txt" 2>&1   # the venv as it is: pytest and the tests'"'"' imports come with the stack
      [ -d "$P/site" ] && "$V" -m pip freeze --path "$P/site" > "$U/tests-site.txt" 2>&1   # and what the tests ferry added
      run() {  # run UPSTREAM NAME ARGS...: NAME the workspace and out folder (a shard'"'"'s: UPSTREAM-I)
        local up=$1 name=$2; shift 2
        case " $UT_ONLY " in *" $up "*) ;; *) return 0 ;; esac
        # NeMo-RL'"'"'s tests import ray and the rest of its stack: the whole setup first (its model.json). Its own
        # launcher (tests/run_unit.sh) first connects to a running Ray cluster, and its init_ray reuses one
        # started outside it; else it starts one with the dashboard, which the staged Ray lacks the extras for
        # (nemo_rl/distributed/virtual_cluster.py:375 "Cannot include dashboard with missing packages").
        if [ "$up" = nemo-rl ]; then
          while_setup setup_model || { stamp "no model.json in ${UT_SETUP:-/tmp/o/setup nor /tmp/o/pretrain} and no setup running: NeMo-RL'"'"'s tests not run"; return 1; }
          # As run_unit.sh: a cluster that runs here already (the learning evidence'"'"'s) is used as it is. Another
          # port with RAY_ADDRESS does not do: Ray asks for its auth token there (seen with Ray 2.60 on a CPU host).
          if /tmp/nrl-run/venv/bin/ray status > /dev/null 2>&1; then
            stamp "NeMo-RL'"'"'s tests use the Ray cluster running here"
          else
            env -u CUDA_VISIBLE_DEVICES RAY_USAGE_STATS_ENABLED=0 setsid -w /tmp/nrl-run/venv/bin/ray start --head \
              --num-gpus=2 --include-dashboard=false --disable-usage-stats > "$U/nemo-rl.ray.txt" 2>&1
            stamp "a Ray cluster for NeMo-RL'"'"'s tests (exit $?)"
          fi
        fi
        # NeMo-RL'"'"'s tests get what its GRPO cases get on this host (nrl_tests_env, shared-gpu-lib.sh): the stand-ins
        # for mlflow, wandb and swanlab after everything else on the path (a test that uses one fails on both sides with
        # the stand-in'"'"'s "not installed on this GPU host", h200/2026-12-04-setup-pydantic-mlflow), the shared-GPU
        # hooks in Ray'"'"'s workers, the workers on the venv'"'"'s Python, Hugging Face offline
        local extra=(); [ "$up" = nemo-rl ] && read -ra extra <<< "$(nrl_tests_env "$PWD")"
        # Megatron-LM'"'"'s and Bridge'"'"'s get the tests ferry'"'"'s site (wandb, flash-linear-attention: what they import
        # that the stack lacks, unpack_tests_ferry), after the trees and TE on their path; the run'"'"'s venv is unchanged
        [ "$up" != nemo-rl ] && [ -d "$P/site" ] && extra=("PYTHONPATH=$P/site")
        # Where the committed GPU runs stopped (--compared: the files one compared whole, on this very series, stay
        # out; --look-again: the known failures to run again, UT_MLM_LOOK_AGAIN)
        local compared=() a
        while IFS= read -r -d "" a; do compared+=("$a"); done < <(compared_args "$up")
        local order=(); [ "$UT_ONE_SIDE" = 0 ] || order=(--one-side-at-a-time)   # pristine, then patched: half the processes
        # the sides (one after the other: twice the budget), the bisection, and room to judge and write
        env "${extra[@]}" timeout -k 30 $((UT_BUDGET * (2 + UT_ONE_SIDE) + UT_BISECT_BUDGET + 300)) python3 tools/upstream_tests.py \
          --workdir "/tmp/ut-work/$name" --only "$up" \
          --python "$V" --shared-gpu --budget "$UT_BUDGET" --test-timeout "$UT_TEST_TIMEOUT" --bisect-budget "$UT_BISECT_BUDGET" --cache /tmp/ut-cache \
          --out "$U/$name" --json "$U/$name.report.json" "${order[@]}" "${compared[@]}" "$@" > "$U/$name.console.txt" 2>&1
        stamp "$name exit $?"
      }
      mlm_files=(); for f in $UT_MLM_FILES; do mlm_files+=(--files "$f"); done   # paths, space-separated
      for i in $(seq 1 "$UT_MLM_SHARDS"); do
        name=megatron-lm; [ "$i" = 1 ] || name=megatron-lm-$i
        sh=(); [ "$UT_MLM_SHARDS" = 1 ] || sh=(--shard "$i/$UT_MLM_SHARDS")
        run megatron-lm "$name" --tests-source megatron-lm="$P/megatron-lm" --nproc 4 "${mlm_files[@]}" "${sh[@]}" &
      done
      # UT_MLM_BISECT_AGAIN=RESULT: a committed Megatron-LM result whose bisection its budget cut, bisected again
      # beside the shards (tools/upstream_tests.py --bisect-again: no side runs; UT_MLM_BISECT_AGAIN_BUDGET its probes'"'"'
      # seconds, default UT_BISECT_BUDGET: the probes start with the shards, so they may take as long as their sides)
      if [ -n "$UT_MLM_BISECT_AGAIN" ]; then
        env PYTHONPATH="$P/site" timeout -k 30 $((UT_MLM_BISECT_AGAIN_BUDGET + 300)) python3 tools/upstream_tests.py \
          --workdir /tmp/ut-work/megatron-lm-bisect --bisect-again "$UT_MLM_BISECT_AGAIN" --python "$V" --shared-gpu \
          --test-timeout "$UT_TEST_TIMEOUT" --bisect-budget "$UT_MLM_BISECT_AGAIN_BUDGET" --cache /tmp/ut-cache --nproc 4 \
          --tests-source megatron-lm="$P/megatron-lm" --out "$U/megatron-lm-bisect" --json "$U/megatron-lm-bisect.report.json" \
          > "$U/megatron-lm-bisect.console.txt" 2>&1 &
      fi
      run megatron-bridge megatron-bridge --tests-source megatron-bridge="$P/megatron-bridge" ${UT_BRIDGE_FILES:+--files "$UT_BRIDGE_FILES"} &
      run nemo-rl nemo-rl ${UT_NRL_FILES:+--files "$UT_NRL_FILES"} &
      wait; stamp "upstream tests done (a Ray cluster is left running: ray stop would take every cluster here)"' ut "${SRC[@]}" > /tmp/o/ut.log 2>&1 < /dev/null &
    echo $! > /tmp/o/ut.pid; stamp "upstream tests started (pid $!)" ;;
  wait-upstream-tests)
    if wait_packing "${2:-300}" /tmp/o/ut.pid pack_ut; then done=1; else done=0; fi
    cat /tmp/o/ut.log; for f in /tmp/o/ut/*.console.txt; do echo "== $f"; tail -6 "$f"; done
    if [ "$done" = 0 ]; then stamp "the upstream tests still run: wait-upstream-tests again"; exit 3; fi ;;
  *) echo "unknown step $1 (run from ${CARRY_SNAPSHOT:-the checkout})" >&2; exit 2 ;;
esac
