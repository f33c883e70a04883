"""integration/nemo_rl_gtp/hooks: the refit check and its mutations, on small real tensors.

Two gloo ranks on this CPU hold GTP shards as megatron-core lays them out (each rank a contiguous
dim-0 row range of the padded tensor, the tensor carrying ``group``, ``gtp_remat_size`` and
``pad_length``) and a whole-weight "inference" copy. The check gathers over the real process group,
cuts the padding and compares exactly; the mutations do what they say; the drift is the relative L2
change computed by hand. The import hook is shown wrapping the name NeMo-RL's module binds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT

HOOKS = ROOT / "integration" / "nemo_rl_gtp" / "hooks"
sys.path.insert(0, str(HOOKS))

import carry_refit_check as rc

RANKS = textwrap.dedent(r'''
    import json, os, sys
    import torch
    import torch.distributed as dist
    import carry_refit_check as rc

    dist.init_process_group("gloo")
    rank, out = dist.get_rank(), {}
    g = dist.group.WORLD
    torch.manual_seed(0)
    # Whole tensors: fc1 with 5 rows (GTP 2 pads it to 6: shards of 3, the last row of rank 1 padding),
    # qkv with 4 rows (no padding), a bias replicated on both ranks.
    whole = {"decoder.layers.0.mlp.linear_fc1.weight": torch.randn(5, 3).to(torch.bfloat16),
             "decoder.layers.0.self_attention.linear_qkv.weight": torch.randn(4, 3).to(torch.bfloat16),
             "decoder.layers.0.self_attention.linear_qkv.bias": torch.randn(4).to(torch.bfloat16)}
    pads = {"decoder.layers.0.mlp.linear_fc1.weight": 1, "decoder.layers.0.self_attention.linear_qkv.weight": 0}

    def shard(name, t):
        if name not in pads:
            return torch.nn.Parameter(t.clone(), requires_grad=False)
        padded = torch.nn.functional.pad(t, (0, 0, 0, pads[name]))
        rows = padded.shape[0] // 2
        p = torch.nn.Parameter(padded[rank * rows:(rank + 1) * rows].clone(), requires_grad=False)
        p.group, p.gtp_remat_size, p.pad_length = g, 2, pads[name]   # as _gtp_attach_attrs leaves them
        return p

    train = [(n, shard(n, t)) for n, t in whole.items()]
    infer = {n: t.clone() for n, t in whole.items()}

    def refit(step, mode):   # the transfer under test's stand-in: whole tensors into the inference copy
        if rc.transfers(step, mode):
            for n, p in train:
                infer[n].copy_(rc.full_tensor(p))

    drift = rc.Drift()
    out["full_shapes"] = {n: list(rc.full_tensor(p).shape) for n, p in train}
    out["gathered_exact"] = all(torch.equal(rc.full_tensor(p), whole[n]) for n, p in train)
    r1 = rc.compare(1, rank, train, infer, drift=drift)
    out["step1"] = [r1.line(), r1.ok, drift.finish()[0]]
    # A training step: every shard moves a little (the fc1 shard's padding row stays zero).
    for n, p in train:
        p.data.add_(0.25)
    if "fc1" in "".join(n for n, _ in train):
        p0 = dict(train)["decoder.layers.0.mlp.linear_fc1.weight"]
        if rank == 1:
            p0.data[-1].zero_()
    moved = {n: rc.full_tensor(p).float() for n, p in train}
    want = (sum(float((moved[n] - whole[n].float()).pow(2).sum()) for n in whole)
            / sum(float(whole[n].float().pow(2).sum()) for n in whole)) ** 0.5
    refit(2, "")
    r2 = rc.compare(2, rank, train, infer, drift=drift)
    rel, frac, n_el = drift.finish()
    out["step2"] = [r2.line(), r2.ok, rel, want, frac, n_el]
    for n, p in train:
        p.data.add_(0.25)
    refit(3, "stale-refit")
    r3 = rc.compare(3, rank, train, infer)
    out["stale"] = [r3.line(), r3.ok, r3.differ]
    before = {n: p.detach().clone() for n, p in train}
    name, restore = rc.corrupt(train, rank)
    refit(4, "corrupt-tensor")
    restore()
    r4 = rc.compare(4, rank, train, infer)
    out["corrupt"] = [name, r4.line(), r4.ok, r4.differ,
                      all(torch.equal(before[n], p) for n, p in train)]
    # Frozen: the first hold records, a training step moves every shard, the next hold puts them back.
    frozen, still = rc.Frozen(), rc.Drift()
    first_held = frozen.hold(train)
    refit(5, "frozen-weights")
    r5 = rc.compare(5, rank, train, infer, drift=still)
    still.finish()
    for n, p in train:
        p.data.add_(0.5)
    held = frozen.hold(train)
    refit(6, "frozen-weights")
    r6 = rc.compare(6, rank, train, infer, drift=still)
    out["frozen"] = [first_held, held, r5.ok, r6.line(), r6.ok, list(still.finish()),
                     all(torch.equal(before[n], p) for n, p in train)]
    with open(os.environ["OUT"] + f"/rank{rank}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)   # gloo's threads can abort a normal interpreter exit ("terminate called ...")
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_check_gathers_gtp_shards_cuts_padding_and_compares_exactly_on_every_rank(tmp_path):
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", RANKS], env={
        **os.environ, "PYTHONPATH": str(HOOKS), "OUT": str(tmp_path), "RANK": str(r), "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}, stderr=subprocess.PIPE, text=True) for r in range(2)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["full_shapes"]["decoder.layers.0.mlp.linear_fc1.weight"] == [5, 3], "padding row cut"
        assert got["gathered_exact"]
        assert got["step1"] == [f"[refit-check] step 1: 3 of 3 tensors equal on rank {rank}", True, 0.0]
        line, ok, rel, want, frac, n_el = got["step2"]
        assert line == f"[refit-check] step 2: 3 of 3 tensors equal on rank {rank}" and ok
        assert abs(rel - want) < 1e-6 * want and rel > 0.05 and 0 < frac <= 1 and n_el == 5 * 3 + 4 * 3 + 4
        # Stale: the weights moved, the refit did not carry them: every tensor differs, on both ranks.
        assert got["stale"][:2] == [f"[refit-check] step 3: 0 of 3 tensors equal on rank {rank}", False]
        name, line, ok, differ, restored = got["corrupt"]
        assert name == "decoder.layers.0.mlp.linear_fc1.weight"
        assert line == f"[refit-check] step 4: 2 of 3 tensors equal on rank {rank}" and not ok
        assert len(differ) == 1 and differ[0].startswith(name) and "9 of 15 elements differ" in differ[0]
        assert restored, "the training tensor is back bit for bit after the transfer"
        # Frozen: the refit after the held step is exact (the check cannot see it), and nothing moved.
        first_held, held, ok5, line, ok6, (rel, frac, n_el), back = got["frozen"]
        assert (first_held, held, ok5) == (0, 3, True)
        assert line == f"[refit-check] step 6: 3 of 3 tensors equal on rank {rank}" and ok6
        assert rel == 0.0 and frac == 0.0 and n_el == 31 and back


def test_a_missing_or_reshaped_inference_tensor_is_unequal():
    import torch
    train = [("a", torch.ones(2)), ("b", torch.ones(3))]
    rep = rc.compare(1, 0, train, {"a": torch.ones(2), "c": torch.ones(1)})
    assert (rep.equal, rep.total, rep.ok) == (1, 3, False)
    assert sorted(d.split(":")[0] for d in rep.differ) == ["b", "c"]
    rep = rc.compare(1, 0, [("a", torch.ones(2))], {"a": torch.ones(3)})
    assert not rep.ok and "shape (2,) trained, (3,)" in rep.differ[0]
    assert not rc.compare(1, 0, [], {}).ok, "nothing compared is no pass"
    # Another dtype on the inference side: equal only if the trained values cast to it are.
    rep = rc.compare(1, 0, [("a", torch.tensor([1.0, 2.0], dtype=torch.bfloat16))],
                     {"a": torch.tensor([1.0, 2.0], dtype=torch.float32)})
    assert rep.ok


def test_mutation_switches_are_named_and_checked(monkeypatch):
    assert rc.transfers(1, "stale-refit") and not rc.transfers(2, "stale-refit") and rc.transfers(5, "")
    monkeypatch.setenv("CARRY_REFIT_MUTATION", "corrupt-tensor")
    assert rc.mutation() == "corrupt-tensor"
    monkeypatch.setenv("CARRY_REFIT_MUTATION", "stale")
    try:
        rc.mutation()
    except ValueError as exc:
        assert "stale-refit, corrupt-tensor, frozen-weights" in str(exc)
    else:
        raise AssertionError("an unknown mutation must be refused")
    import torch
    try:
        rc.corrupt([("w", torch.ones(2))], 0)
    except RuntimeError as exc:
        assert "no GTP-sharded tensor" in str(exc)
    else:
        raise AssertionError("corrupt-tensor without a GTP tensor must be refused")


FAKE_WORKER = '''
def swap_model_weights(src_model, target_model, *args, **kwargs):
    return ("original", src_model, target_model)

def _reshard_into_inference_model(a, b):
    return swap_model_weights(a, b, refit_method="nccl")
'''


def test_the_import_hook_wraps_the_name_nemo_rls_worker_module_binds(tmp_path):
    """sitecustomize + CARRY_REFIT_CHECK=1: importing the worker module replaces its swap_model_weights;
    a call with one side None (the non-colocated halves) passes through untouched."""
    pkg = tmp_path / "nemo_rl" / "models" / "generation" / "megatron"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "nemo_rl", tmp_path / "nemo_rl" / "models", tmp_path / "nemo_rl" / "models" / "generation",
              pkg):
        (d / "__init__.py").write_text("")
    (pkg / "megatron_worker.py").write_text(FAKE_WORKER)
    code = ("import nemo_rl.models.generation.megatron.megatron_worker as w\n"
            "print(getattr(w.swap_model_weights, 'carry_refit_check', False))\n"
            "print(w._reshard_into_inference_model(None, 'dst')[0])\n")
    env = {**os.environ, "PYTHONPATH": f"{HOOKS}:{tmp_path}", "CARRY_REFIT_CHECK": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-2:] == ["True", "original"]
    assert "[refit-check] wrapping nemo_rl.models.generation.megatron.megatron_worker.swap_model_weights" in res.stdout
    res = subprocess.run([sys.executable, "-c", code], env={**env, "CARRY_REFIT_CHECK": "0"}, capture_output=True, check=False,
                         text=True, timeout=120)
    assert res.stdout.splitlines()[-2:] == ["False", "original"], "off unless asked for"


# -- the wrapper end to end, through the import hook (issue 40) -----------------------------------
# NeMo-RL's worker module as the hook meets it: its own binding of swap_model_weights, called from
# _reshard_into_inference_model. The binding here is the transfer under test's stand-in on two gloo ranks:
# every training tensor whole (each GTP shard all-gathered over its group, padding cut) into the inference
# model, written independently of the check's own gather.
E2E_WORKER = '''
import torch
import torch.distributed as dist


def swap_model_weights(src_model, target_model, refit_method="nccl"):
    dst = dict(target_model.named_parameters())
    with torch.no_grad():
        for name, p in src_model.named_parameters():
            local = p.detach().as_subclass(torch.Tensor)
            size = getattr(p, "gtp_remat_size", 1)
            if size > 1:
                parts = [torch.zeros_like(local) for _ in range(size)]
                dist.all_gather(parts, local.contiguous(), group=p.group)
                local = torch.cat(parts)[: local.shape[0] * size - p.pad_length]
            dst[name].copy_(local)


def _reshard_into_inference_model(src, dst):
    return swap_model_weights(src, dst, refit_method="nccl")
'''
E2E_RANKS = r'''
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
import nemo_rl.models.generation.megatron.megatron_worker as worker   # the hook wraps it here

torch.manual_seed(0)
WHOLE = {"decoder.layers.0.mlp.linear_fc1.weight": (torch.randn(5, 3), 1),
         "decoder.layers.0.self_attention.linear_qkv.weight": (torch.randn(4, 3), 0),
         "decoder.layers.0.self_attention.linear_qkv.bias": (torch.randn(4), None),
         "embedding.word_embeddings.weight": (torch.randn(7, 3), 1)}


def model(sharded):
    root = torch.nn.Module()
    for name, (t, pad) in WHOLE.items():
        mod = root
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        if sharded and pad is not None:
            padded = torch.nn.functional.pad(t, (0, 0, 0, pad))
            rows = padded.shape[0] // 2
            p = torch.nn.Parameter(padded[rank * rows:(rank + 1) * rows].clone().to(torch.bfloat16))
            p.group, p.gtp_remat_size, p.pad_length = dist.group.WORLD, 2, pad
        else:
            p = torch.nn.Parameter(t.clone().to(torch.bfloat16) if sharded else torch.zeros_like(t, dtype=torch.bfloat16))
        mod.register_parameter(leaf, p)
    return root


train, infer = model(True), model(False)
for step in range(1, 5):
    worker._reshard_into_inference_model(train, infer)
    with torch.no_grad():   # a training step: every element moves
        for p in train.parameters():
            p.add_(0.5)
dist.barrier()
dist.destroy_process_group()
os._exit(0)
'''


def _e2e(tmp_path, mcore_tree, mutation: str) -> dict[int, str]:
    pkg = tmp_path / "nemo_rl" / "models" / "generation" / "megatron"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (pkg, *pkg.parents):
        if d == tmp_path:
            break
        (d / "__init__.py").write_text("")
    (pkg / "megatron_worker.py").write_text(E2E_WORKER)
    port = str(_free_port())
    base = {k: v for k, v in os.environ.items() if not k.startswith("CARRY_")}
    env = {**base, "PYTHONPATH": f"{HOOKS}:{tmp_path}:{mcore_tree}", "CARRY_REFIT_CHECK": "1",
           "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
           **({"CARRY_REFIT_MUTATION": mutation} if mutation else {})}
    procs = [subprocess.Popen([sys.executable, "-c", E2E_RANKS], env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-3000:] for o in outs]
    return {r: outs[r][0] for r in range(2)}


def _counts(out: str) -> dict[int, tuple[int, int]]:
    import re
    return {int(m["step"]): (int(m["eq"]), int(m["n"])) for m in re.finditer(
        r"^\[refit-check\] step (?P<step>\d+): (?P<eq>\d+) of (?P<n>\d+) tensors equal on rank \d+$", out, re.M)}


def _changed(out: str) -> dict[int, float]:
    import re
    return {int(m["step"]): float(m["frac"]) for m in re.finditer(
        r"^\[weight-change\] step (?P<step>\d+): rel_l2 \S+, changed (?P<frac>\S+) of \d+ elements", out, re.M)}


@pytest.mark.parametrize("mutation, counts, moved", [
    ("", {1: 4, 2: 4, 3: 4, 4: 4}, True),                 # every refit exact; the weights move
    ("stale-refit", {1: 4, 2: 0, 3: 0, 4: 0}, True),      # only the first refit sends: every tensor differs after
    ("corrupt-tensor", {1: 3, 2: 3, 3: 3, 4: 3}, True),   # one shard negated in transit: one tensor, every step
    ("frozen-weights", {1: 4, 2: 4, 3: 4, 4: 4}, False),  # exact refits of weights put back: nothing moved
])
def test_the_wrapper_end_to_end_through_the_import_hook_on_two_gloo_ranks(tmp_path, mcore_tree, mutation, counts, moved):
    """The hook (sitecustomize, CARRY_REFIT_CHECK=1) wraps the worker module's binding; each refit is checked on
    both ranks after the transfer, against the training model's tensors: each mutation changes the counts it
    should, on every rank. A wrapper that compared the training model with itself would print 4 of 4 for the
    stale and the corrupted refits; one that undid the corruption before the transfer, 4 of 4 for the latter."""
    outs = _e2e(tmp_path, mcore_tree, mutation)
    for rank, out in outs.items():
        assert "[refit-check] wrapping nemo_rl.models.generation.megatron.megatron_worker.swap_model_weights" in out
        assert {s: eq for s, (eq, n) in _counts(out).items()} == counts, (rank, out)
        assert {n for _, n in _counts(out).values()} == {4}, out
        changed = _changed(out)
        assert changed[1] == 0.0 and all((changed[s] > 0) == moved for s in (2, 3, 4)), (rank, changed)
    if mutation == "corrupt-tensor":
        assert "negated in transit" in outs[0] and "decoder.layers.0.mlp.linear_fc1.weight:" in outs[0]


def test_patching_a_module_twice_wraps_its_function_once():
    """The hook may meet the worker module more than once (a re-import): a second patch must not wrap the
    wrapper, which would count every refit twice (steps 2, 4, 6: every step marker of steps 1..N missed)."""
    import types

    def swap_model_weights(src_model, target_model, *args, **kwargs):
        return "original"

    module = types.ModuleType("fake_worker")
    module.swap_model_weights = swap_model_weights
    rc.patch(module)
    once = module.swap_model_weights
    assert once is not swap_model_weights and once.__wrapped__ is swap_model_weights and once.carry_refit_check
    rc.patch(module)
    assert module.swap_model_weights is once and module.CARRY_REFIT_CHECK_WRAPPED
