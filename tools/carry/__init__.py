"""gtp-carry: carry patch series for upstreams until they land there.

One module per concept; the scripts in ``tools/`` are thin wrappers around
``carry.cli``.
"""

__version__ = "0.1.0"
