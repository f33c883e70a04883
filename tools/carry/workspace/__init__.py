"""The workspaces: what applying a series builds. It owns resolving each upstream to a ready base
(sources, with the PyPI artifacts' download and unpacking in artifacts), the ``git am`` plumbing
(am), the all-or-nothing apply transaction (apply) and its scratch trial of an edited series
(trial), the work directory with its record and journal (workdir, record), export back to patch
files (export) and the patched wheels (wheels). It may import the core and carry.series, never
carry.evidence, carry.images, carry.nightly or carry.commands."""
