"""The learning cases' two switches into NeMo-RL's own run: harness code, not a patch (sitecustomize installs
them in every Python of the case, Ray's workers included).

``CARRY_GREEDY_VALIDATION=1``: NeMo-RL's ``grpo.validate`` samples as training does (it passes
``greedy=False`` to its rollout at this pin; ``val_temperature`` differing from ``temperature`` is refused
outside NeMo-Gym). The learning gate wants the policy's own answer to each held-out problem, so while
``validate`` runs, the rollout functions ``nemo_rl.algorithms.grpo`` binds are called with ``greedy=True``
(megatron generation then takes top-k 1 and temperature 0). Training rollouts are untouched.

``CARRY_LEARNING_MUTATION=sign-flip``: ``ClippedPGLossFn`` (``nemo_rl.algorithms.loss.loss_functions``)
sees every advantage negated on its way into the loss, in the workers that compute it. The advantages the
driver logs (``train/advantages/*``) and the groups (``pct_mixed``) are the run's own; the weights move and
every refit is exact: only the learning gate can see that the policy was pushed away from the reward.
"""

from __future__ import annotations

import functools
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


def greedy_in_validation(module) -> None:
    """Wrap MODULE's validate and its rollout bindings: greedy while validate runs, as bound otherwise."""
    if getattr(module, "CARRY_GREEDY_VALIDATION", False):
        return
    for name in ROLLOUTS:
        fn = getattr(module, name, None)
        if fn is None:
            continue

        def rollout(*args, _fn=fn, **kwargs):
            if _Validating.depth:
                kwargs["greedy"] = True
            return _fn(*args, **kwargs)

        setattr(module, name, functools.wraps(fn)(rollout))
    validate = module.validate

    @functools.wraps(validate)
    def greedy_validate(*args, **kwargs):
        _Validating.depth += 1
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
