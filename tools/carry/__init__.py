"""gtp-carry: carry patch series for upstreams until they land there.

One module per concept; the commands (``gtp-carry <verb>``, or the thin
``tools/<verb>.py`` scripts) live in ``carry.commands`` and are dispatched by
``carry.cli``.
"""

__version__ = "0.1.0"
