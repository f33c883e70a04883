"""Stand-ins for NeMo-RL's optional loggers on the GPU host (run-on-gpu-host puts stubs/ on PYTHONPATH).

NeMo-RL imports wandb, mlflow and swanlab at module level (nemo_rl/utils/logger.py,
nemo_rl/experience/*) although the functional test turns all three off; together they are
about 45 MB of wheels plus their dependencies. These modules let the imports succeed and
fail loudly on any use: an attribute is a placeholder that raises when called or read, so a
run that really logs to one of them stops with a message naming this stand-in. They exist
only in this harness; the patches and NeMo-RL are untouched.
"""

import sys


class _Unavailable:
    def __init__(self, what: str):
        self._what = what

    def _refuse(self, *args, **kwargs):
        raise RuntimeError(f"{self._what}: not installed on this GPU host (run-on-gpu-host stand-in, "
                           "integration/nemo_rl_gtp/stubs); turn this logger off")

    __call__ = _refuse

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse()

    def __bool__(self):
        return False


def install(module_name: str) -> None:
    module = sys.modules[module_name]
    module.__dict__["HARNESS_STAND_IN"] = True

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{module_name}.{name}")

    module.__getattr__ = __getattr__
