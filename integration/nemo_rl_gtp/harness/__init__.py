"""The NeMo-RL GRPO + GTP run on an offline GPU host: stage here, run there.

``stage`` (this machine, package index reachable) fetches and hash-checks the
wheels the GPU host lacks, writes the Qwen2.5-0.5B-shaped model's config (the GPU
host builds its weights from it and the seed), the tokenizer and dataset, takes
the trees and patched wheels from the series, and packs it all into ferry parts.
``run-on-gpu-host`` (there, offline) builds the environment with the image
recipe's steps, runs the GRPO cases and leaves what tools/nightly.py judges.
See integration/README.md.
"""
