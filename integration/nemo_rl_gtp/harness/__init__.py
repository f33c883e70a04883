"""The NeMo-RL GRPO + GTP run on an offline GPU host: stage here, run there.

``stage`` (this machine, package index reachable) fetches and hash-checks the
wheels the GPU host lacks, writes the Qwen2.5-0.5B-shaped model's config (the GPU
host builds its weights from it and the seed), the tokenizer and dataset, takes
the trees and patched wheels from the series, and packs it all into ferry parts.
``run-on-gpu-host`` (there, offline) builds the environment with the image
recipe's steps, runs the GRPO cases and leaves what tools/nightly.py judges.

The rooms, each a sub-package that imports only the rooms below it (tests/test_harness_house.py
checks the table; integration/README.md's "Layout" draws it):

- ``models``: the model, tokenizer and data built from the seed, the MoE model, the pretrain step
  (scripts the host's venv runs too: they import nothing of the harness but each other);
- ``probes``: what the dry-run runs inside its stand-in venv (imports, signatures, the config);
  scripts that import nothing of the harness;
- ``staging``: what is staged here: the wheel lock, the wheels, the ferry, the stage;
- ``host``: what runs on the GPU host: the setup and its layout, the cases, the learning case,
  the case run;
- ``dryrun``: run-on-gpu-host --dry-run on this CPU machine;
- ``cli`` (a module): the two command lines, on top of them all.
"""
