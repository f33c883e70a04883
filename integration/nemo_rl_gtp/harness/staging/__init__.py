"""What is staged here, on the machine that reaches the package index: the wheel lock
(wheel_lock.py: wheels.toml read, checked and written), the wheels it pins (wheels.py: fetched,
hash-checked, unpacked for transport, zipped again there; --relock), the ferry's parts
(ferry.py), and the stage that puts it all into the ``nrl`` payload (stage.py).

May import models (the configs and data it writes) and carry; never host, dryrun or cli. The
host imports the lock, the wheels' checks and the ferry from here: the format is defined once.
"""
