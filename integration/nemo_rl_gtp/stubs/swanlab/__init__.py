"""Stand-in for swanlab: see stubs/_harness_stub.py."""

from _harness_stub import install

install(__name__)
