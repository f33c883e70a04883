"""Upstream's own unit tests as a verdict of the carry: pristine and patched, test by test.

select (which test files meet the files the series touches), suite (the pinned tests checkout, each
side's folder in the upstream's own layout), launch (upstream's launch, rank by rank, resumed past a
crash or a hang, bounded by a budget), results (what each rank's reporter wrote, merged per test) and
verdict (regressions bisected to a patch, the tests the carry turns green, known failures).
``site/`` is the reporter: a pytest plugin put on each rank's path as a folder, not imported.
"""
