"""The nightly: every (series x image x test) cell of ``integration/nightly.toml``, run and judged.
It owns the matrix (config), turning cells into launch plans (plan), starting them here, under
``docker run`` or ``srun`` (launch), reading the files a run left, bounded (artifacts), its log
(runlog) and its metrics (metrics) and judging it (judge), the run of the whole night (run) and
what it leaves behind (report), and the night as PNG figures (figures: matplotlib, optional). It may import the core,
carry.series, carry.workspace and carry.evidence (proofs, bisection, the canary), never
carry.images or carry.commands."""
