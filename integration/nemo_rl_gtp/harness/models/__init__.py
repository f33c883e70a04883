"""The models a run starts from, built where nothing can be downloaded: the Qwen2.5-0.5B-shaped
model, its tokenizer, the arithmetic data and how an answer is scored (fixtures.py), the small
Qwen3-MoE model (moe_fixtures.py), and the pretrain step that teaches the dense one the task
(pretrain.py).

Each module also runs as a script in the GPU host's venv (``python3 harness/models/fixtures.py
weights ...``), so a module here imports nothing of the harness but its neighbours in this room,
and nothing of carry (the venv has none). The lowest room: every other may import it.
"""
