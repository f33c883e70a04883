"""The probes: scripts the dry-run runs inside its stand-in venv, with NeMo-RL's tree on the path:
the import closure of the GRPO path (probe_imports.py, which the host's setup also runs), NeMo-RL's
calls into megatron-core and Bridge against the installed signatures (probe_signatures.py), and
run_grpo's config, tokenizer and data (probe_config.py).

They are run by path, never imported by the harness: they import nothing of it (nor of carry),
only each other by plain name and the series' CPU finder (patches/gtp/proofs/_cpu.py).
"""
