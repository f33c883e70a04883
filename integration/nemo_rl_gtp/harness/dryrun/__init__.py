"""run-on-gpu-host --dry-run: as much of the GPU host's run as this CPU machine can do, for real.
run.py drives the steps and reports each; standin.py builds the stand-in venv, runs the image
steps that need no GPU and records the functional script's command lines.

May import host, staging, models and carry; only cli imports it. The probes are run by path.
"""
