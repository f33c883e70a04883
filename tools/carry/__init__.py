"""gtp-carry: carry patch series for upstreams until they land there.

The package is a house of rooms, one concept each, that import one way (tests/test_house.py
checks it): the core here (runner, errors, shell, files, lock, progress, report) <- carry.series <-
carry.workspace <- carry.evidence and carry.images <- carry.nightly <- carry.commands. The
commands (``gtp-carry <verb>``, or the thin ``tools/<verb>.py`` scripts) live in carry.commands
and are dispatched by name by carry.cli.
"""

__version__ = "0.1.0"
