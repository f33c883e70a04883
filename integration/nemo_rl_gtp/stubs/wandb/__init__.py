"""Stand-in for wandb: see stubs/_harness_stub.py."""

from _harness_stub import install

install(__name__)
