"""What runs on the GPU host: the setup and the host's layout, the one way the harness runs a
child (setup.py), the cases (cases.py), the learning cases' model and metrics (learning.py), and
running one case (caserun.py).

May import models, staging (the lock and the wheels it reads) and carry; never dryrun or cli.
"""
