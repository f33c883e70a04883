"""Upstream's own unit tests as a verdict of the carry: pristine and patched, test by test.

select (which test files meet the files the series touches), suite (the pinned tests checkout, each
side's folder in the upstream's own layout), launch (upstream's launch, rank by rank, resumed past a
crash or a hang, bounded by a budget), results (what each rank's reporter wrote, merged per test) and
verdict (regressions bisected to a patch, the tests the carry turns green, known failures); taken (a
launch's records read once, for a live run and for a cut run judged from them), check (both sides, the
comparison and the bisection), earlier (an earlier run's result.json read back with what the launches
beside it tell), record (the fixed tests written beside their patch) and rerun (recorded
tests run once on a new base, for retire).
``site/`` is the reporter: a pytest plugin put on each rank's path as a folder, not imported.
"""
