"""The learning cases' two switches into NeMo-RL's own run: harness code, not a patch (sitecustomize installs
them in every Python of the case, Ray's workers included).

``CARRY_GREEDY_VALIDATION=1``: NeMo-RL's ``grpo.validate`` samples as training does (it passes
``greedy=False`` to its rollout at this pin; ``val_temperature`` differing from ``temperature`` is refused
outside NeMo-Gym). The learning gate wants the policy's own answer to each held-out problem, so while
``validate`` runs, the rollout functions ``nemo_rl.algorithms.grpo`` binds are called with ``greedy=True``
(megatron generation then takes top-k 1 and temperature 0). Training rollouts are untouched. Each held-out
answer is printed as a ``[validation-answer]`` line (the problem, the answer, its reward), so that a run's
gain can be told apart by kind of problem (``harness.host.learning.validation_by_sign``).

``CARRY_LEARNING_MUTATION=sign-flip``: ``ClippedPGLossFn`` (``nemo_rl.algorithms.loss.loss_functions``)
sees every advantage negated on its way into the loss, in the workers that compute it. The advantages the
driver logs (``train/advantages/*``) and the groups (``pct_mixed``) are the run's own; the weights move and
every refit is exact: only the learning gate can see that the policy was pushed away from the reward.
"""

from __future__ import annotations

import functools
import json
import os

from carry_after_import import after_import

GRPO = "nemo_rl.algorithms.grpo"
LOSS = "nemo_rl.algorithms.loss.loss_functions"
ROLLOUTS = ("run_multi_turn_rollout", "run_async_multi_turn_rollout")
MUTATIONS = ("sign-flip",)


def _say(text: str) -> None:
    print(text, flush=True)


def learning_mutation() -> str:
    m = os.environ.get("CARRY_LEARNING_MUTATION", "")
    if m and m not in MUTATIONS:
        raise ValueError(f"CARRY_LEARNING_MUTATION={m!r} is not one of {', '.join(MUTATIONS)}")
    return m


class _Validating:
    depth = 0
    calls = 0   # validate's calls so far: the answers' validation index is calls - 1 (0: before the first step)


ANSWER_LINE = "[validation-answer] "   # harness.host.learning.validation_by_sign reads these from run.log


def say_answers(result) -> None:
    """One line per held-out answer of the validation that runs, from what its rollout returned: the
    prompt (the user turn, the problem in it), the policy's answer and its reward. Never raises: a batch it
    cannot read is one line that says so."""
    try:
        batch = result[0]
        for log, reward in zip(batch["message_log"], batch["total_reward"].tolist(), strict=True):
            said = [m["content"] for m in log if m["role"] == "assistant"]
            _say(ANSWER_LINE + json.dumps({"validation": _Validating.calls - 1, "reward": float(reward),
                                           "problem": next(m["content"] for m in log if m["role"] == "user"),
                                           "answer": said[-1] if said else None}))
    except Exception as exc:  # noqa: BLE001 - a diagnostic: the run goes on without it
        _say(f"{ANSWER_LINE}unreadable: {exc!r}"[:300])


def greedy_in_validation(module) -> None:
    """Wrap MODULE's validate and its rollout bindings: greedy while validate runs, as bound otherwise."""
    if getattr(module, "CARRY_GREEDY_VALIDATION", False):
        return
    for name in ROLLOUTS:
        fn = getattr(module, name, None)
        if fn is None:
            continue

        def rollout(*args, _fn=fn, **kwargs):
            if not _Validating.depth:
                return _fn(*args, **kwargs)
            kwargs["greedy"] = True
            result = _fn(*args, **kwargs)
            say_answers(result)
            return result

        setattr(module, name, functools.wraps(fn)(rollout))
    validate = module.validate

    @functools.wraps(validate)
    def greedy_validate(*args, **kwargs):
        _Validating.depth += 1
        _Validating.calls += 1
        try:
            return validate(*args, **kwargs)
        finally:
            _Validating.depth -= 1

    module.validate = greedy_validate
    module.CARRY_GREEDY_VALIDATION = True
    _say(f"[validation] greedy: {module.__name__}.validate's rollouts decode greedily (pid {os.getpid()})")


def flip_advantages(module) -> None:
    """ClippedPGLossFn.__call__ with data["advantages"] negated for the call (put back after it)."""
    cls = module.ClippedPGLossFn
    if getattr(cls.__call__, "carry_sign_flip", False):
        return
    call = cls.__call__

    @functools.wraps(call)
    def flipped(self, next_token_logprobs, data, *args, **kwargs):
        advantages = data["advantages"]
        data["advantages"] = -advantages
        try:
            return call(self, next_token_logprobs, data, *args, **kwargs)
        finally:
            data["advantages"] = advantages

    flipped.carry_sign_flip = True
    cls.__call__ = flipped
    _say(f"[learning-mutation] sign-flip: {module.__name__}.ClippedPGLossFn sees every advantage negated "
         f"(pid {os.getpid()})")


def install() -> None:
    if os.environ.get("CARRY_GREEDY_VALIDATION") == "1":
        after_import(GRPO, greedy_in_validation)
    if learning_mutation() == "sign-flip":
        after_import(LOSS, flip_advantages)
