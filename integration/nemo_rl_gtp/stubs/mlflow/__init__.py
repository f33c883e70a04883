"""Stand-in for mlflow: see stubs/_harness_stub.py."""

from _harness_stub import install

install(__name__)
