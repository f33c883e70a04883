"""The runs on the GPU host: one functional script, every case of ``CASES`` (patched, resume,
pristine-nemo-rl, pristine-mcore, gtp-off, moe, and the learning cases with their mutations and
matrix runs, ``learning_cases()``).

Every case runs NeMo-RL's own ``tests/functional/grpo_megatron_generation_gtp.sh``
(patch nrl 0004: megatron generation, colocated, refit over NCCL, two GPUs,
TP1 with two weight shards, two GRPO steps) and appends only what an offline
host needs (the local model and data) plus the case's own change. Overrides
after the script's own win (Hydra applies them in order).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCRIPT = "tests/functional/grpo_megatron_generation_gtp.sh"
# The patched case saves every step; resume starts from this one alone and must run the next.
RESUME_FROM = 1
DATA_KEYS = ("problem", "expected_answer")


@dataclass(frozen=True)
class Case:
    name: str
    shows: str
    expect: str              # "green" or "red"
    nemo_rl: str             # "patched" or "pristine"
    megatron_core: str       # "patched" or "pristine"
    overrides: tuple[str, ...] = ()
    checkpoint: str = "none"  # "save", "resume" or "none"
    needs: tuple[str, ...] = field(default_factory=tuple)  # cases whose output this one reads
    model: str = "random"    # "random": the seed's weights; "trained": after the pretrain step (pretrain.py)
    refit_check: bool = False  # hooks/carry_refit_check.py after every refit (CARRY_REFIT_CHECK=1)
    mutation: str = ""       # CARRY_REFIT_MUTATION: "stale-refit" or "corrupt-tensor" (breaks the refit)
    test: str = "grpo-megatron-generation-gtp"  # the nightly.toml entry whose gates and markers judge it
    shape: str = "dense"     # "dense" (fixtures.py) or "qwen3-moe" (moe_fixtures.py): which built model
    markers: tuple[str, ...] = ()  # log lines the case needs beyond the script's own markers
    # A red case is as expected only when, for each metric named here, a gate that reads it failed (the
    # one the mutation is there to turn red), not merely when something failed.
    red_by: tuple[str, ...] = ()
    # NeMo-RL's validation on the held-out set (fixtures.write_validation) before the first step and after
    # the last, greedy (hooks/carry_learning.py); "sign-flip": the advantages negated into the loss.
    validation: bool = False
    learning_mutation: str = ""


CASES: dict[str, Case] = {c.name: c for c in (
    Case("patched", "the series: GTP training, a dedicated whole-weight inference model, NCCL refit; both markers, "
         "token_mult_prob_error < 1.05; checkpoints saved at steps 1 and 2 through Megatron-Bridge",
         "green", "patched", "patched", checkpoint="save"),
    Case("resume", f"step {RESUME_FROM + 1} again, resumed from the step-{RESUME_FROM} checkpoint alone: Bridge's "
         "load with the replica groups of the series, then a GTP step and a save; the script's 2-step horizon "
         "is kept (a longer one changes Bridge's scheduler lengths, which its load refuses unless "
         "override_opt_param_scheduler is set)", "green", "patched", "patched",
         checkpoint="resume", needs=("patched",)),
    Case("pristine-nemo-rl", "NeMo-RL without the series: the script's GTP keys "
         "(policy.megatron_cfg.tensor_parallel_num_weight_shards) do not exist there, so the run stops at the "
         "override", "red", "pristine", "patched"),
    Case("pristine-mcore", "the patched NeMo-RL on pristine megatron-core 0.19.2: rank 0 stops first at "
         "compile_helpers' make on the wheel install (mlm-dataset-helpers-wheel); past it GTP meets the "
         "megatron-core GTP bugs (tied-weight shape guard, bias sizing, inference collection, refit planner, the tied "
         "embedding's dummy wgrad)",
         "red", "patched", "pristine"),
    Case("gtp-off", "control: the same run with the shard count null (GTP off); no dedicated model is needed, "
         "so the markers are absent by design; token_mult_prob_error is reported",
         "green", "patched", "patched",
         ("policy.megatron_cfg.tensor_parallel_num_weight_shards=null",)),
    # The expert axis (issue 23), for the two-GPU run: a Qwen3-MoE-shaped model (moe_fixtures.py).
    Case("moe", "GTP on both axes on a tiny Qwen3-MoE-shaped model (8 routed SwiGLU experts, top-2, TE grouped "
         "GEMM, untied, QK layernorm): the script's tensor_parallel_num_weight_shards=2 and "
         "expert_tensor_parallel_num_weight_shards=2, both through the shim to initialize_model_parallel; a "
         "dedicated whole-weight inference model and the NCCL refit of dense and expert GTP shards; the script's "
         "gates and markers, and the shim's line naming expert_gtp_remat_size=2",
         "green", "patched", "patched",
         ("policy.megatron_cfg.expert_tensor_parallel_num_weight_shards=2",), shape="qwen3-moe",
         markers=("[gtp] enabling GTP weight rematerialization (gtp_remat_size=2 expert_gtp_remat_size=2)",)),
)}


# -- learning: GRPO from the pretrained model, the refit checked after every refit -----------------
LEARNING_TEST = "grpo-megatron-generation-gtp-learning"
MATRIX_TEST = "grpo-megatron-generation-matrix"
# The learning cases' own overrides; the script's config stays as it is (every GTP, refit and generation
# setting). Measured on one H200 (integration/h200/2026-12-04-learning-at-5e-6): with the script's batch of
# 4 (16 optimizer steps per GRPO step of 16 prompts x 4 samples) at lr 5e-6 for six steps, the correct run
# did not learn (held-out greedy accuracy 0.6426 before and after) while the sign-flipped one fell to 0.5186.
# What the run showed: only 6 to 27% of the groups were mixed (the pretrained model samples at 0.13 to 0.26
# nats a token, so a prompt's four samples mostly agree: not the 81% that independent draws at p = 0.65
# would give): 4 to 17 of a step's 64 samples carried an advantage, so most of its 16 optimizer steps saw
# none; the gradient norms logged per step were 1e-8 to 7e-3 (16 at one step), and the weights moved alike
# in both runs (rel_l2 0.0015). So the
# case now takes NeMo-RL's own recipe's shape (examples/configs/grpo_math_1B_megatron.yaml: 16 samples a
# prompt, train_global_batch_size = every sample of the step, so one optimizer step per GRPO step on the
# whole step's advantages), at 16 prompts a step (256 samples), six steps as before. The lr: Adam moves
# each weight by about lr at most per optimizer step, so 6 steps at 3e-5 bound the movement at 1.8e-4, under
# half the measured run's bound (96 x 5e-6 = 4.8e-4), now along whole-step gradients, and 53 times below the
# bound of the 1e-4 run that collapsed (integration/h200/2026-12-04-gtp-folder-learning-cut: 96 x 1e-4,
# 0.84% of the weights' L2 in its first GRPO step). Measured (integration/h200/2026-12-05-learning-at-3e-5):
# 30 to 60% of the correct run's groups mixed (12 to 60% of the flipped run's), gradient norms 0.45 to
# 1.45, and still no learning: the correct run's held-out accuracy 0.6426 to 0.6074, the sign-flipped
# one's 0.6445 to 0.3623, every other gate held. The
# pretrained model, trained by imitation of correct answers, leaves reward nothing to teach in six steps;
# the pretrain corpus now has a gap only reward closes (pretrain.SIGN_DROP, where it is derived), and these
# settings stay. Measured (integration/h100/2026-12-05-learning-passed, the nightly's cell): held-out accuracy
# 0.4893 to 0.6318 (gain 0.1426 > 0.0663), negative answers 0 to 130 of 154, every other gate held.
# No checkpoints: the script's own setting (so no resume interplay with the longer horizon).
LEARNING_LR = "3e-5"
LEARNING_STEPS = 6
LEARNING_PROMPTS = 16
LEARNING_SAMPLES = 16   # per prompt: NeMo-RL's recipe's num_generations_per_prompt
# The lr recipes (shared-gpu-h200.sh's wave 1 runs these): around the chosen lr, below the 1e-4 that collapsed.
LR_RECIPES = ("1e-5", "3e-5", "6e-5")


def learning_settings(lr: str = LEARNING_LR) -> tuple[str, ...]:
    """The learning cases' own training settings (GTP, refit and generation stay the script's).

    LEARNING_STEPS steps of LEARNING_PROMPTS prompts x LEARNING_SAMPLES samples, all of a step's samples in
    one optimizer step (NeMo-RL's recipe's shape), at a constant lr: the config's warmup (13 scheduler ticks
    from 5e-7, one tick per GRPO step) would keep a short run far below it. The validation: the held-out set
    (VALIDATION rows, fixtures.py) before the first step and after the last, all of it (max_val_samples, in
    batches of 256), and no split of the GRPO prompts (their 5% would join the held-out set)."""
    return (f"grpo.max_num_steps={LEARNING_STEPS}", f"grpo.num_prompts_per_step={LEARNING_PROMPTS}",
            f"grpo.num_generations_per_prompt={LEARNING_SAMPLES}",
            f"policy.train_global_batch_size={LEARNING_PROMPTS * LEARNING_SAMPLES}",
            f"policy.megatron_cfg.optimizer.lr={lr}", "policy.megatron_cfg.scheduler.lr_warmup_iters=0",
            "grpo.val_at_start=true", "grpo.val_at_end=true", "grpo.val_period=0",
            f"grpo.max_val_samples={VALIDATION}", "grpo.val_batch_size=256",
            "data.train.split_validation_size=0")


VALIDATION = 1024   # fixtures.VALIDATION_PROBLEMS: the held-out set's size, which the gate's margin is derived from
LEARNING = learning_settings()
GTP_OFF = "policy.megatron_cfg.tensor_parallel_num_weight_shards=null"
NO_CUDA_GRAPHS = "policy.generation.mcore_generation_config.cuda_graph_impl=none"
# What the refit check prints per rank after every refit (hooks/carry_refit_check.py), as a whole log
# line: Ray prefixes a worker's lines with its colour code and "(MegatronPolicyWorker[rank=0] pid=N)".
RAY_PREFIX = r"(?:\x1b\[[0-9;]*m)?(?:\([^()]*\)(?:\x1b\[0m)? )?"
REFIT_CHECK_LINE = (RAY_PREFIX + r"\[refit-check\] step (?P<step>\d+): (?P<equal>\d+) of (?P<n>\d+) tensors equal "
                    r"on rank (?P<rank>\d+)")
WEIGHT_CHANGE_LINE = (RAY_PREFIX + r"\[weight-change\] step (?P<step>\d+): rel_l2 (?P<rel>\S+), changed "
                      r"(?P<frac>\S+) of (?P<n>\d+) elements on rank (?P<rank>\d+)")


# The series the harness adds to metrics.json from the refit check's lines (learning.harness_metrics),
# which the learning entry's gates in nightly.toml read and a mutation's red_by names.
UNVERIFIED = "harness/refit_check/unverified_tensors"
EQUAL = "harness/refit_check/tensors_equal"
DRIFT = "harness/policy/rel_l2_change"
CHANGED = "harness/policy/changed_fraction"


GAIN = "harness/validation/accuracy_gain"   # learning.validation_metrics: end minus start, greedy, held out


def learning_cases() -> tuple[Case, ...]:
    def case(name, shows, expect, *extra, refit_check=True, mutation="", test=LEARNING_TEST, red_by=(),
             learning_mutation="", lr=LEARNING_LR):
        return Case(name, shows, expect, "patched", "patched", learning_settings(lr) + extra, model="trained",
                    refit_check=refit_check, mutation=mutation, test=test, red_by=red_by, validation=True,
                    learning_mutation=learning_mutation)
    return (
        case("learning", f"GRPO that learns: {LEARNING_STEPS} steps from the pretrained model (GTP2, dedicated "
             "inference model); greedy accuracy on the held-out set rises by more than that set's noise; mixed "
             "groups and non-zero advantages at every step, the weights moving, token_mult_prob_error < 1.05, "
             "and every refit checked tensor by tensor on every rank", "green"),
        case("learning-sign-flip", "mutation: the advantages negated on their way into the loss; the weights "
             "move, refits are exact, groups are mixed: red by the learning gate alone", "red",
             learning_mutation="sign-flip", red_by=(GAIN,)),
        # The lr is the case's own setting, chosen by measurement (pending): one recipe per candidate.
        *(case(f"learning-lr{lr}", f"recipe: the learning case at lr {lr} (to choose the case's lr by measurement)",
               "green", lr=lr, test=MATRIX_TEST) for lr in LR_RECIPES),
        case("learning-stale-refit", "mutation: every refit after the first is skipped; the refit check must fail "
             "from step 2 on", "red", mutation="stale-refit", red_by=(UNVERIFIED,)),
        case("learning-corrupt-tensor", "mutation: rank 0's GTP shard of one tensor is negated in transit; the refit "
             "check must fail at every step", "red", mutation="corrupt-tensor", red_by=(UNVERIFIED,)),
        case("learning-frozen-weights", "mutation: the training weights are put back to the first refit's before "
             "every later refit (the optimizer's updates never reach what is sent); every refit is exact, so "
             "the drift gate must fail", "red", mutation="frozen-weights", red_by=(CHANGED,)),
        # The 1.1011 question on the trained model: token_mult_prob_error per step in case.json.
        case("learning-gtp-off", "matrix: the learning run with GTP off (shared model, no refit); it must learn "
             "too (the learning gate), so that the 1.1011 matrix compares two runs that learn", "green", GTP_OFF,
             refit_check=False, test=MATRIX_TEST),
        case("learning-no-cuda-graphs", "matrix: the learning run (GTP2) with Megatron generation's CUDA graphs off",
             "green", NO_CUDA_GRAPHS, test=MATRIX_TEST),
        case("learning-gtp-off-no-cuda-graphs", "matrix: GTP off and CUDA graphs off", "green", GTP_OFF,
             NO_CUDA_GRAPHS, refit_check=False, test=MATRIX_TEST),
    )


CASES.update({c.name: c for c in learning_cases()})


def configured_steps(case: Case) -> int | None:
    """The GRPO steps a case sets (its last grpo.max_num_steps override), else None (the script's own;
    a resumed case runs only the steps after its checkpoint)."""
    steps = [int(o.split("=", 1)[1]) for o in case.overrides if o.startswith("grpo.max_num_steps=")]
    return steps[-1] if steps else None


def case_env(case: Case) -> dict[str, str]:
    """What a case adds to the run's environment (the hooks read it in every process)."""
    env = {}
    if case.refit_check:
        env["CARRY_REFIT_CHECK"] = "1"
    if case.mutation:
        env["CARRY_REFIT_MUTATION"] = case.mutation
    if case.validation:
        env["CARRY_GREEDY_VALIDATION"] = "1"
    if case.learning_mutation:
        env["CARRY_LEARNING_MUTATION"] = case.learning_mutation
    return env


_NOT_THE_CASES = ("policy.model_name=", "data.train.dataset_name=", "++data.train.", "++data.validation=",
                  "checkpointing.")


def as_recorded(name: str, args: list[str]) -> Case:
    """Case NAME as a recorded run ran it (its case.json's ``args``): the case's own overrides are the
    recorded ones, and it validated only if they asked for it (evidence recorded before the held-out
    validation is judged without the learning gate, which it could not show)."""
    from dataclasses import replace

    own = tuple(a for a in args if not a.startswith(_NOT_THE_CASES))
    return replace(CASES[name], overrides=own, validation="grpo.val_at_start=true" in own)


def validation_overrides(path: str) -> list[str]:
    """NeMo-RL's validation data: the held-out set as a ResponseDataset of its own (data.validation is null
    in the config, hence one dict)."""
    return [f"++data.validation={{dataset_name:ResponseDataset,data_path:{path},input_key:{DATA_KEYS[0]},"
            f"output_key:{DATA_KEYS[1]}}}"]


def offline_overrides(model: str, data: str) -> list[str]:
    """What every case adds to the script's overrides: the local model and data (new keys need ++)."""
    return [
        f"policy.model_name={model}",
        "data.train.dataset_name=ResponseDataset",
        f"++data.train.data_path={data}",
        f"++data.train.input_key={DATA_KEYS[0]}",
        f"++data.train.output_key={DATA_KEYS[1]}",
    ]


def checkpoint_overrides(case: Case, checkpoint_dir: str) -> list[str]:
    if case.checkpoint == "none":
        return []
    # Saved at every step; resume gets a folder holding only step RESUME_FROM (NeMo-RL resumes from
    # the newest step_N it finds), so it runs the script's last step again from there.
    return ["checkpointing.enabled=true", f"checkpointing.checkpoint_dir={checkpoint_dir}",
            "checkpointing.save_period=1"]


def script_args(case: Case, model: str, data: str, checkpoint_dir: str, validation: str | None = None) -> list[str]:
    """The script's arguments for CASE; VALIDATION is the held-out set a validating case needs (NeMo-RL stops
    without one: validation on, no data)."""
    if case.validation and not validation:
        raise ValueError(f"case {case.name} validates: give it the held-out set (fixtures.write_validation)")
    val = validation_overrides(validation) if case.validation else []
    return offline_overrides(model, data) + checkpoint_overrides(case, checkpoint_dir) + list(case.overrides) + val


def select(names: list[str]) -> list[Case]:
    unknown = [n for n in names if n not in CASES]
    if unknown:
        from carry.errors import UsageError
        raise UsageError(f"unknown case(s): {', '.join(unknown)}", hint=f"known: {', '.join(CASES)}")
    return [CASES[n] for n in names]
