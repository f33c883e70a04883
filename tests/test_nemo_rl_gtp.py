"""integration/nemo_rl_gtp: what runs on this machine, end to end on real files.

The stage's lock and its hash checks (a bad hash stops it), the wheels' unpack / RECORD /
zip-again round trip that carries them to the GPU host, the seeded model, tokenizer and
data (the stage's config and the weights built from it), the ferry format with the real recv.sh, the dry-run on a small part set, the uv and
logger stand-ins, and the nightly's gpu-host cell: its command line, and its judging of
recorded run folders with the grpo test's own gates and markers. The GPU run itself is the
lead's (integration/README.md); the full dry-run needs a Python 3.12 venv with torch 2.11
(several GB) and runs by hand.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import HOST_PACKAGES, ROOT, SERIES, pins, read_json, tool

NRL = ROOT / "integration" / "nemo_rl_gtp"
sys.path.insert(0, str(NRL))

from carry.errors import IntegrityError, OperationError  # noqa: E402
from harness.host import cases as casing  # noqa: E402
from harness.host import caserun  # noqa: E402
from harness.host import setup as hostsetup  # noqa: E402
from harness.models import fixtures  # noqa: E402
from harness.staging import ferry, wheel_lock, wheels  # noqa: E402

MARK_GTP = "[gtp] enabling GTP weight rematerialization"
MARK_RESHARD = "[colocated-reshard] building dedicated inference model"


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(path: Path, files: dict[str, bytes], name: str = "tinypkg", version: str = "1.0") -> Path:
    """A real wheel: files, METADATA, WHEEL and a RECORD with their hashes."""
    info = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    rows = [[n, _digest(d), str(len(d))] for n, d in files.items()] + [[f"{info}/RECORD", "", ""]]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zi = zipfile.ZipInfo(n)
            zi.external_attr = (0o755 if n.endswith("/tool") else 0o644) << 16  # like ray's gcs_server
            zf.writestr(zi, d)
        zf.writestr(f"{info}/RECORD", buf.getvalue())
    return path


# -- the lock and the stage's hash checks --------------------------------------------------------
def test_the_dry_runs_stand_in_is_the_measured_host():
    """[dryrun] holds the GPU host's packages at the versions read there
    (integration/proofs/h200-host-packages.txt), each pinned: an unpinned name took the index's
    newest in the stand-in, e.g. filelock 4.x where the host has 3.32.5, the very difference that
    stopped the Bridge proof's environment on the host. What the host lacks may stand in [dryrun] only
    when the te ferry brings it ([[te]], at that version): pydantic, which TE imports. (Read from a hand
    list here before, pydantic was allowed although the stage's te ferry did not carry it: the H200
    setup stopped at step 90 on 2026-12-04, No module named 'pydantic'.)"""
    from packaging.utils import canonicalize_name as norm

    host = pins(HOST_PACKAGES)
    lk = wheel_lock.load(NRL / "wheels.toml")
    te_ferry = {norm(a.name): a.version for a in lk.te}
    assert lk.host_torch == host["torch"]
    wrong = []
    for spec in lk.host_packages:
        name, _, version = spec.partition("==")
        want = te_ferry.get(norm(name)) or host.get(norm(name))
        if version != want:
            wrong.append(f"{spec} (the host: {want or 'absent'})")
    assert not wrong, wrong


def test_lock_is_canonical_and_pins_every_artifact():
    lk = wheel_lock.load(NRL / "wheels.toml")
    assert wheel_lock.render(lk) == (NRL / "wheels.toml").read_text(), "wheels.toml is not in render()'s form"
    names = {a.name for a in lk.artifacts}
    # The findings the issue names, and the ones measured since (energon, modelopt's pulp, fastapi).
    for need in ("ray", "jsonschema", "hydra-core", "omegaconf", "antlr4-python3-runtime", "transformers",
                 "tokenizers", "nvidia-modelopt", "pulp", "datasets", "megatron-energon", "math-verify",
                 "nvidia-resiliency-ext", "defusedxml", "grpcio-tools"):
        assert need in names, need
    nvrx = next(a for a in lk.wheels if a.name == "nvidia-resiliency-ext")
    assert nvrx.version == "0.6.0" and "manylinux_2_39_x86_64" in lk.platforms  # NeMo-RL's pin; its only wheel
    tf = next(a for a in lk.wheels if a.name == "transformers")
    assert tf.version.startswith("5.8."), "NeMo-RL asserts transformers < 5.12 at import"
    assert [a.name for a in lk.sdists] == ["antlr4-python3-runtime"]
    assert next(a for a in lk.wheels if a.name == "ray").dropped("ray/jars/ray_dist.jar")
    assert lk.host_torch == "2.11.0" and all(a.why for a in lk.artifacts)
    # FlashAttention-4 for megatron-core's dynamic-batching attention: HAVE_FA4 wants flash-attn-4 >=
    # 4.0.0b20; the CuTe DSL goes with its cu13 libs only (the host's driver runs CUDA 13).
    from packaging.version import Version
    fa4 = next(a for a in lk.wheels if a.name == "flash-attn-4")
    assert Version(fa4.version) >= Version("4.0.0b20")
    for need in ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core",
                 "nvidia-cutlass-dsl-libs-cu13", "quack-kernels", "apache-tvm-ffi"):
        assert need in names, need
    assert "nvidia-cutlass-dsl-libs-cu12" not in names


def test_the_lock_pins_what_the_upstream_tests_import_apart_from_the_run(tmp_path):
    """[[tests]]: what Megatron-LM's own unit tests import that the stack lacks (wandb and openai and what they
    need beside the stack, flash-linear-attention, emerging-optimizers, pytest-asyncio) and Bridge's (diffusers), at the versions of each one's own
    uv.lock at its tests commit; the tests ferry carries them, never the run's venv. A name pinned in two tables is refused."""
    lk = wheel_lock.load(NRL / "wheels.toml")
    got = {a.name: a.version for a in lk.tests}
    assert got == {"wandb": "0.28.1", "platformdirs": "4.11.3", "sentry-sdk": "2.68.0",
                   "flash-linear-attention": "0.4.2", "fla-core": "0.4.2", "diffusers": "0.39.0", "openai": "2.53.0",
                   "distro": "1.9.0", "jiter": "0.16.0", "sniffio": "1.3.1", "emerging-optimizers": "0.3.0",
                   "pytest-asyncio": "1.4.0"}, got
    assert all(a.why for a in lk.tests) and not set(got) & {a.name for a in lk.artifacts + lk.te}
    twice = tmp_path / "wheels.toml"
    entry = 'name = "x"\nversion = "1"\nfile = "x-1-py3-none-any.whl"\nsha256 = "' + "0" * 64 + '"\n'
    twice.write_text(f"[[wheel]]\n{entry}\n[[tests]]\n{entry}")
    with pytest.raises(Exception, match="pinned more than once: x"):
        wheel_lock.load(twice)


def test_bad_lock_entries_are_config_errors(tmp_path):
    bad = tmp_path / "wheels.toml"
    bad.write_text('[[wheel]]\nname = "x"\nversion = "1"\nfile = "x-1-py3-none-any.whl"\nsha256 = "abc"\n')
    with pytest.raises(Exception, match="64 lowercase hex"):
        wheel_lock.load(bad)
    bad.write_text('[[wheel]]\nname = "x"\nversion = "1"\nfile = "f"\nsha256 = "' + "0" * 64 + '"\nwhy_not = 1\n')
    with pytest.raises(Exception, match="unknown key 'why_not'"):
        wheel_lock.load(bad)


def test_stage_refuses_a_wheel_whose_hash_differs(tmp_path):
    """A cached file with the pinned name but other bytes stops the stage; the right bytes pass."""
    whl = make_wheel(tmp_path / "cache" / "wheels" / "tinypkg-1.0-py3-none-any.whl", {"tinypkg/__init__.py": b"x = 1\n"})
    good = hashlib.sha256(whl.read_bytes()).hexdigest()
    lk = wheel_lock.Lock(tmp_path / "w.toml", "3.12", ("any",),
                      (wheel_lock.Artifact("tinypkg", "1.0", whl.name, "f" * 64, "test"),), ())
    with pytest.raises(IntegrityError, match="the lock says f{64}"):
        wheels.fetch(lk, tmp_path / "cache" / "wheels")  # present in the cache: no download, but checked
    with pytest.raises(IntegrityError, match="lock says"):
        wheels.stage_wheels(lk, tmp_path / "cache", tmp_path / "out")
    assert not (tmp_path / "out" / whl.name).exists(), "nothing is unpacked from a wheel that failed its hash"
    lk = wheel_lock.Lock(lk.path, "3.12", ("any",), (wheel_lock.Artifact("tinypkg", "1.0", whl.name, good, "test"),), ())
    assert wheels.fetch(lk, tmp_path / "cache" / "wheels") == {"tinypkg": whl}
    with pytest.raises(IntegrityError, match="expected the file"):
        wheel_lock.check_file(whl, wheel_lock.Artifact("tinypkg", "1.0", "other.whl", good))


@pytest.mark.network
def test_pip_download_with_a_wrong_pinned_hash_fails(tmp_path):
    """The real index: the pinned file with a wrong sha256 is refused by the hash check."""
    lk = wheel_lock.load(NRL / "wheels.toml")
    a = next(a for a in lk.wheels if a.name == "braceexpand")
    wrong = wheel_lock.Lock(lk.path, lk.python, lk.platforms, (wheel_lock.Artifact(a.name, a.version, a.file, "0" * 64),), ())
    with pytest.raises(IntegrityError):
        wheels.fetch(wrong, tmp_path / "dl")
    right = wheel_lock.Lock(lk.path, lk.python, lk.platforms, (a,), ())
    assert wheels.fetch(right, tmp_path / "dl2")["braceexpand"].name == a.file


def test_the_glibc_the_staged_wheels_need_is_checked_before_anything():
    from carry.errors import OperationError
    files = [a.file for a in wheel_lock.load(NRL / "wheels.toml").wheels]
    assert wheels.wheel_glibc("x-1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl") == (2, 17)
    assert wheels.wheel_glibc("x-1-py3-none-any.whl") is None
    need, which = wheels.glibc_needed(files)
    assert need == (2, 39) and which.startswith("nvidia_resiliency_ext-0.6.0-")
    with pytest.raises(OperationError, match=r"has glibc 2\.36; the staged wheel nvidia_resiliency_ext-0\.6\.0-.* "
                                             r"needs glibc >= 2\.39"):
        wheels.check_glibc(files, have=(2, 36))
    assert wheels.check_glibc(files, have=(2, 39)) == (2, 39)
    # the setup's first step, on this machine's real glibc
    have = wheels.this_glibc()
    if have is not None and have >= (2, 39):
        assert hostsetup.check_platform().startswith("glibc %d.%d" % have)
    else:
        with pytest.raises(OperationError, match="needs glibc >= 2.39"):
            hostsetup.check_platform()


def test_unpack_drops_trims_record_and_zips_again_for_pip(tmp_path):
    whl = make_wheel(tmp_path / "tinypkg-1.0-py3-none-any.whl",
                     {"tinypkg/__init__.py": b"VALUE = 42\n", "tinypkg/jars/big.jar": b"J" * 5000,
                      "tinypkg/tool": b"#!/bin/sh\necho tool\n"})
    a = wheel_lock.Artifact("tinypkg", "1.0", whl.name, hashlib.sha256(whl.read_bytes()).hexdigest(),
                         drop=("tinypkg/jars/*",))
    info = wheels.unpack(whl, a, tmp_path / "unpacked")
    folder = tmp_path / "unpacked" / whl.name
    assert info["dropped_files"] == 1 and info["dropped_bytes"] == 5000
    assert not (folder / "tinypkg" / "jars").exists()
    assert "jars" not in (folder / "tinypkg-1.0.dist-info" / "RECORD").read_text()
    assert wheels.verify_unpacked(folder) == 4
    assert os.access(folder / "tinypkg" / "tool", os.X_OK), "executables stay executable (ray's servers)"
    again = wheels.rezip(folder, tmp_path / "house")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    str(again)], check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-c", "import tinypkg; print(tinypkg.VALUE)"], env={**os.environ,
                         "PYTHONPATH": str(site)}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "42"
    assert os.access(site / "tinypkg" / "tool", os.X_OK)
    (folder / "tinypkg" / "__init__.py").write_text("VALUE = 43\n")
    with pytest.raises(IntegrityError, match="does not match its RECORD"):
        wheels.rezip(folder, tmp_path / "house2")
    (folder / "tinypkg" / "extra.py").write_text("")
    with pytest.raises(IntegrityError, match="not in RECORD"):
        wheels.verify_unpacked(folder)


# -- the model, tokenizer and data ----------------------------------------------------------------
def _tree_hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


QWEN25_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "use_sliding_window": False, "hidden_act": "silu"}


def test_fixtures_are_the_qwen25_05b_shape_and_repeat_with_the_seed(tmp_path):
    """The stage's side: tokenizer, config (no weights) and data, byte for byte from the seed."""
    prompt = "Think step-by-step.\n{}\n"
    fixtures.build_all(tmp_path / "a", 7, prompt)
    fixtures.build_all(tmp_path / "b", 7, prompt)
    fixtures.build_all(tmp_path / "c", 8, prompt)
    a, b, c = (_tree_hashes(tmp_path / x) for x in "abc")
    assert a == b, "the same seed must give the same bytes"
    assert a["data/train.jsonl"] != c["data/train.jsonl"]
    assert not [n for n in a if n.endswith(".safetensors")], "the ferry carries no weights: they are built there"

    from transformers import AutoConfig, AutoTokenizer
    cfg = AutoConfig.from_pretrained(tmp_path / "a" / "model")
    assert cfg.model_type == "qwen2" and cfg.architectures == ["Qwen2ForCausalLM"]
    assert {k: getattr(cfg, k) for k in QWEN25_05B} == QWEN25_05B
    rope = getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]
    assert rope == 1e6 and str(getattr(cfg, "dtype", None) or cfg.torch_dtype).endswith("bfloat16")
    assert fixtures.check_shape(tmp_path / "a" / "model")["rope_theta"] == 1e6
    tok = AutoTokenizer.from_pretrained(tmp_path / "a" / "model")
    assert len(tok) <= 1024 < cfg.vocab_size and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert (cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id) == (tok.eos_token_id, tok.pad_token_id,
                                                                       tok.convert_tokens_to_ids("<|endoftext|>"))
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok("What is 12 * 7?")["input_ids"]) == "What is 12 * 7?"
    rows = [json.loads(x) for x in (tmp_path / "a" / "data" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 256 and set(rows[0]) == set(casing.DATA_KEYS)
    q = rows[0]["problem"].removeprefix("What is ").removesuffix("?")
    assert str(eval(q)) == rows[0]["expected_answer"]  # noqa: S307 - our own generated arithmetic


def test_a_config_of_another_shape_is_refused(tmp_path):
    fixtures.build_all(tmp_path, 7)
    cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    cfg["hidden_size"] = 256
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"not the Qwen2\.5-0\.5B shape.*hidden_size.*\(256, 896\)"):
        fixtures.build_weights(tmp_path / "model", 7)
    assert not list((tmp_path / "model").glob("*.safetensors"))


def test_weights_are_built_from_the_config_and_the_seed_as_the_gpu_host_does(tmp_path):
    """The GPU host's side: the real 0.5B build (about 1 GB, tens of seconds), run as setup runs it."""
    fixtures.build_all(tmp_path / "f", 7)
    model = tmp_path / "f" / "model"
    shipped = _tree_hashes(model)
    res = subprocess.run([sys.executable, str(NRL / "harness" / "models" / "fixtures.py"), "weights", str(model), "--seed", "7",
                          "--json", str(tmp_path / "w.json")], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    built = json.loads((tmp_path / "w.json").read_text())
    assert built["parameters"] == 494_032_768 and not built["reused"]  # Qwen2.5-0.5B's count
    assert list(built["files"]) == ["model.safetensors"]
    assert built["files"]["model.safetensors"] == hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()
    now = _tree_hashes(model)
    assert {k: now[k] for k in shipped} == shipped, "the shipped config and tokenizer stay as they came"

    from safetensors import safe_open
    with safe_open(model / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" not in keys, "tied: the output layer reuses the embedding"
        assert tuple(f.get_slice("model.embed_tokens.weight").get_shape()) == (151936, 896)
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert f"model.layers.23.self_attn.{proj}.bias" in keys
        assert "model.layers.0.self_attn.o_proj.bias" not in keys
        assert tuple(f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape()) == (128, 896)  # 2 KV heads
        assert tuple(f.get_slice("model.layers.0.mlp.gate_proj.weight").get_shape()) == (4864, 896)  # SwiGLU
        assert str(f.get_tensor("model.norm.weight").dtype) == "torch.bfloat16"
    again = fixtures.build_weights(model, 7)
    assert again["reused"] and again["files"] == built["files"], "a second setup keeps the built weights"
    (model / "model.safetensors").write_bytes(b"damaged")
    rebuilt = fixtures.build_weights(model, 7)
    assert not rebuilt["reused"] and rebuilt["files"] == built["files"], "damaged weights are rebuilt, same bytes"


# -- the ferry ------------------------------------------------------------------------------------
def _pack_small(root: Path, name: str, part_bytes: int = 8192) -> list[Path]:
    (root / ".git").mkdir(parents=True, exist_ok=True)
    payload = root / "payload.tar.xz"
    payload.write_bytes(os.urandom(10_000))
    return ferry.pack(root, name, payload, {"payload_sha256": hashlib.sha256(payload.read_bytes()).hexdigest()},
                      part_bytes=part_bytes)


def test_ferry_parts_travel_one_per_call_through_recv_sh(tmp_path):
    name = f"t{os.getpid()}"  # recv.sh keeps parts in /tmp/ferry/NAME between calls
    parts = _pack_small(tmp_path / "repo", name)
    assert len(parts) == 3 and all(p.stat().st_size <= 8192 for p in parts)
    info = ferry.check(tmp_path / "repo", name)
    assert info["manifest"]["payload_sha256"] and info["members"] == [f"{name}/manifest.json",
                                                                       f"{name}/payload.tar.xz"]
    assert "/.ferry/" in (tmp_path / "repo" / ".git" / "info" / "exclude").read_text()
    dest = tmp_path / "dest"
    try:
        for i, part in enumerate(parts):  # each "call" carries recv.sh, NAME.sha256 and one part
            call = tmp_path / f"call{i}" / ".ferry"
            call.mkdir(parents=True)
            for f in (tmp_path / "repo" / ".ferry" / "recv.sh", tmp_path / "repo" / ".ferry" / f"{name}.sha256", part):
                shutil.copy2(f, call / f.name)
            res = subprocess.run(["bash", str(call / "recv.sh"), name, str(dest)], capture_output=True, text=True)
            assert res.returncode == 0, res.stderr
            want = "complete" if i == len(parts) - 1 else f"have {i + 1} of {len(parts)}"
            assert want in res.stdout
        got = dest / name / "payload.tar.xz"
        assert got.read_bytes() == (tmp_path / "repo" / "payload.tar.xz").read_bytes()
    finally:
        shutil.rmtree(f"/tmp/ferry/{name}", ignore_errors=True)


def test_a_part_fits_one_call_beside_the_working_tree_that_travels_with_it(tmp_path):
    """A device call carries 64 MB (written 64 MiB; 64.7 MB was refused): the checkout's tracked and not-ignored files, then one part.
    The part is what is left (less a 2 MiB margin, at most 56 MiB); ignored files do not count; a
    tree that leaves less than 16 MiB is a usage error that says what to do."""
    from carry.errors import UsageError
    from carry.git import Git

    repo = tmp_path / "repo"
    Git(repo).init()
    (repo / ".gitignore").write_text("/.ferry/\n/big-ignored\n")
    (repo / "small.txt").write_bytes(b"x" * 1000)
    assert ferry.part_bytes_for(repo) == 56 * 2**20  # a small tree: the most a part holds
    (repo / "logs.bin").write_bytes(os.urandom(11 * 2**20 + 5))  # untracked, not ignored: it travels
    (repo / "big-ignored").write_bytes(b"\0" * (40 * 2**20))   # ignored: it stays home
    assert ferry.travelling_bytes(repo) == 11 * 2**20 + 5 + 1000 + len((repo / ".gitignore").read_bytes())
    part = ferry.part_bytes_for(repo)
    assert part == 48 * 2**20, part / 2**20  # 64 MB (61.04 MiB) - 11.0 - 2 = 48.03..., whole MiB
    assert part + ferry.travelling_bytes(repo) + ferry.MARGIN_BYTES <= ferry.CALL_BYTES
    (repo / "more.bin").write_bytes(b"\0" * (36 * 2**20))
    with pytest.raises(UsageError, match="leaves .* MiB of the 64 MB a call carries for a ferry part"):
        ferry.part_bytes_for(repo)


def test_a_damaged_part_is_caught_here_and_there(tmp_path):
    name = f"d{os.getpid()}"
    parts = _pack_small(tmp_path / "repo", name)
    data = bytearray(parts[1].read_bytes())
    data[10] ^= 0xFF
    parts[1].write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="joined parts have sha256"):
        ferry.check(tmp_path / "repo", name)
    try:
        res = subprocess.run(["bash", str(tmp_path / "repo" / ".ferry" / "recv.sh"), name, str(tmp_path / "d")],
                             capture_output=True, text=True)
        assert res.returncode == 1 and "hash mismatch" in res.stderr
        assert not (tmp_path / "d" / ".ferry-ok").exists()
    finally:
        shutil.rmtree(f"/tmp/ferry/{name}", ignore_errors=True)
    parts[0].unlink()
    with pytest.raises(IntegrityError, match="2 part"):
        ferry.check(tmp_path / "repo", name)


# -- the dry-run on a small part set ---------------------------------------------------------------
def test_the_dry_run_names_a_staged_wheel_that_wants_another_version_than_the_host_has(tmp_path):
    """The host installs the staged wheels --no-deps, so a staged package that requires another
    version of what the host holds is found only by an import there. The stand-in's pip check
    names it; a host package's own conflict and a declared requirement left out on purpose are
    not the staged wheels' doing and are not counted."""
    from harness.dryrun.standin import staged_version_conflicts
    from helpers import tiny_wheel

    wheels_dir = tmp_path / "w"
    wheels_dir.mkdir()
    host = [tiny_wheel(wheels_dir, "carryhostlock", "3.0"),
            tiny_wheel(wheels_dir, "carryhostother", "1.0", ("carryhostlock>=4",))]  # the host's own clash
    staged = [tiny_wheel(wheels_dir, "carrystagedstore", "1.0", ("carryhostlock>=4.1,<5",)),
              tiny_wheel(wheels_dir, "carrystagedfine", "1.0", ("carryhostlock<4", "carryleftout>=1"))]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    vpy = str(venv / "bin" / "python")
    subprocess.run([vpy, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                    *map(str, host + staged)], check=True)
    clash = staged_version_conflicts(vpy, [w.name for w in staged])
    assert len(clash) == 1 and clash[0].startswith("carrystagedstore 1.0 has requirement carryhostlock"), clash
    assert "carryhostlock 3.0" in clash[0]
    # A pip check that cannot run (no pip in that interpreter) is an error, never "no conflicts".
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    with pytest.raises(OperationError, match="pip check in the stand-in did not report"):
        staged_version_conflicts(str(bare / "bin" / "python"), [w.name for w in staged])


def _fake_nrl_ferry(root: Path, damaged: bool = False) -> None:
    """A payload shaped like the stage's, with two tiny real wheels, packed as the nrl ferry."""
    import lzma
    import tarfile
    pay = root / "payload"
    for n in ("alpha", "beta"):
        whl = make_wheel(root / "dl" / f"{n}-1.0-py3-none-any.whl", {f"{n}/__init__.py": b"A = 1\n"}, name=n)
        wheels.unpack(whl, None, pay / "wheels")
    if damaged:
        (pay / "wheels" / "beta-1.0-py3-none-any.whl" / "beta" / "__init__.py").write_text("A = 2\n")
    (pay / "stage.json").write_text("{}\n")
    xz = root / "payload.tar.xz"
    with lzma.open(xz, "wb") as f, tarfile.open(fileobj=f, mode="w|") as tf:
        for p in sorted(pay.rglob("*")):
            tf.add(p, p.relative_to(pay).as_posix(), recursive=False)
    (root / ".git").mkdir(exist_ok=True)
    ferry.pack(root, "nrl", xz, {"payload_sha256": hashlib.sha256(xz.read_bytes()).hexdigest(),
                                 "payload_bytes": xz.stat().st_size, "series_digest": "0" * 64, "wheels": 2},
               part_bytes=2048)


def _dry(root: Path, check: int):
    res = subprocess.run([sys.executable, str(NRL / "run-on-gpu-host"), "--dry-run", "--parts-only",
                          "--ferry-root", str(root)], capture_output=True, text=True, timeout=300)
    assert res.returncode == check, res.stdout + res.stderr
    return res.stdout


def test_dry_run_checks_a_small_part_set(tmp_path):
    _fake_nrl_ferry(tmp_path / "ok")
    out = _dry(tmp_path / "ok", 0)
    assert "ok   ferry nrl:" in out and "ok   wheels against RECORD: 2 wheels" in out
    assert "n/a  ferry te" in out  # said, not hidden: the te ferry is staged elsewhere
    _fake_nrl_ferry(tmp_path / "bad", damaged=True)
    assert "does not match its RECORD" in _dry(tmp_path / "bad", 1)
    (tmp_path / "ok" / ".ferry" / "nrl.part01").unlink()
    assert "FAIL ferry nrl" in _dry(tmp_path / "ok", 1)


def test_probe_reports_a_flag_megatron_core_decides_at_import():
    """--flag passes only on True: how the dry-run and the GPU host's setup ask for HAVE_FA4."""
    probe = NRL / "harness" / "probes" / "probe_imports.py"
    res = subprocess.run([sys.executable, str(probe), "--flag", "os:supports_bytes_environ", "--flag", "json:decoder",
                          "--flag", "json:no_such_name", "--call", "json:loads:1", "json"],
                         capture_output=True, text=True, timeout=120)
    recs = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    flags = {r["flag"]: r for r in recs if "flag" in r}
    assert flags["os:supports_bytes_environ"] == {"flag": "os:supports_bytes_environ", "ok": os.supports_bytes_environ,
                                                  "value": repr(os.supports_bytes_environ)}
    assert not flags["json:decoder"]["ok"] and flags["json:decoder"]["value"].startswith("<module")
    assert not flags["json:no_such_name"]["ok"] and "AttributeError" in flags["json:no_such_name"]["error"]
    assert next(r for r in recs if "call" in r)["value"] == "1"
    assert res.returncode == 1 and recs[-1]["flags"] == 3


# -- the stand-ins ----------------------------------------------------------------------------------
def test_uv_stand_in_runs_or_records_the_command(tmp_path):
    uv = NRL / "shims" / "uv"
    (tmp_path / "hello.py").write_text("import sys; print('hello', sys.argv[1:])\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    res = subprocess.run([str(uv), "run", "--no-sync", "hello.py", "a"], cwd=tmp_path, env=env, capture_output=True,
                         text=True)
    assert res.returncode == 0 and res.stdout.strip() == "hello ['a']"
    rec = tmp_path / "rec.jsonl"
    res = subprocess.run([str(uv), "run", "coverage", "run", "-a", "examples/run_grpo.py", "x=1"], cwd=tmp_path,
                         env={**env, "CARRY_UV_RECORD": str(rec)}, capture_output=True, text=True)
    assert res.returncode == 0
    assert json.loads(rec.read_text())["argv"] == ["python", "-m", "coverage", "run", "-a", "examples/run_grpo.py",
                                                   "x=1"]
    res = subprocess.run([str(uv), "sync"], env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "only 'uv run'" in res.stderr


def test_logger_stand_ins_import_and_refuse_any_use():
    code = ("import wandb, mlflow, swanlab\nfrom wandb import Table, Histogram\n"
            "assert wandb.HARNESS_STAND_IN and not wandb.run\n"
            "for call in (lambda: Table(), lambda: wandb.init(project='x'), lambda: mlflow.set_experiment('e')):\n"
            "    try:\n        call()\n    except RuntimeError as e:\n        assert 'stand-in' in str(e)\n"
            "    else:\n        raise SystemExit('a stand-in did not refuse')\nprint('refused')\n")
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(NRL / "stubs")},
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "refused", res.stderr


def test_every_case_appends_to_the_functional_scripts_own_config():
    assert {"patched", "resume", "pristine-nemo-rl", "pristine-mcore", "gtp-off", "moe"} <= set(casing.CASES)
    for case in casing.CASES.values():
        args = casing.script_args(case, "/m", "/d.jsonl", "/ck", "/v.jsonl")
        assert args[:5] == ["policy.model_name=/m", "data.train.dataset_name=ResponseDataset",
                            "++data.train.data_path=/d.jsonl", "++data.train.input_key=problem",
                            "++data.train.output_key=expected_answer"]
    assert "checkpointing.save_period=1" in casing.script_args(casing.CASES["patched"], "/m", "/d", "/ck")
    # Resume keeps the script's horizon: a longer one changes Bridge's scheduler lengths, which its load refuses.
    assert not [a for a in casing.script_args(casing.CASES["resume"], "/m", "/d", "/ck") if "max_num_steps" in a]
    for case in casing.CASES.values():  # Bridge's asynchronous checkpointing stays at its default (nvrx is staged)
        assert not [a for a in casing.script_args(case, "/m", "/d", "/ck", "/v") if "async" in a], case.name
    assert casing.script_args(casing.CASES["gtp-off"], "/m", "/d", "/ck")[-1] == \
        "policy.megatron_cfg.tensor_parallel_num_weight_shards=null"
    script = (ROOT / "patches/gtp/nemo-rl/0004-functional-test-grpo-megatron-generation-gtp.patch").read_text()
    assert '"${overrides[@]}" "$@"' in script, "the script must pass the harness's overrides after its own"


# -- the nightly's gpu-host cell ---------------------------------------------------------------------
def test_gpu_host_cell_runs_the_harness_on_tonights_trees(tmp_path):
    res = tool("nightly", "--out", tmp_path / "o", "--print-commands", "--images", "gpu-host",
               "--tests", "grpo-megatron-generation-gtp", check=0)
    line = next(x for x in res.stdout.splitlines() if "run-on-gpu-host" in x)
    w = tmp_path / "o" / "work" / "gtp"
    assert f"--skip-setup --nemo-rl-tree {w / 'nemo-rl'}" in line   # the case: the test's CARRY_NRL_CASES
    assert f"--front {w / 'megatron-lm'} --front {w / 'megatron-bridge'}/src" in line
    assert f"--out {tmp_path / 'o' / 'cells' / 'gtp--gpu-host--grpo-megatron-generation-gtp' / 'artifacts'}" in line


# A recorded run folder laid out as run-on-gpu-host leaves it, played back as the cell's command.
REPLAY = r'''
import shutil, sys
from pathlib import Path
script, out, rec = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
assert script == "tests/functional/grpo_megatron_generation_gtp.sh", script
for name in ("run.log", "metrics.json"):
    if (rec / name).exists():
        shutil.copy2(rec / name, out / name)
sys.stdout.write((rec / "case.log").read_text())
sys.exit(int((rec / "exit_status").read_text()))
'''


def _recorded(root: Path, name: str, *, rc: int, markers: tuple[str, ...], err: float | None, extra: str = "",
              grad_norm: float = 0.75, first: int = 1):
    d = root / name
    d.mkdir(parents=True)
    log = "".join(f"{m} (gtp_remat_size=2)\n" for m in markers) + "step 2/2 done\n" + extra
    (d / "run.log").write_text(log)
    (d / "case.log").write_text("[run-on-gpu-host] case patched\n" + log)
    if err is not None:
        # A resumed run (first 2) logs the steps after its checkpoint alone, as 16-resume.metrics.json does.
        metrics = {"train/token_mult_prob_error": {"1": 1.0001, "2": err}, "train/loss": {"1": 0.5, "2": 0.4},
                   "train/grad_norm": {"1": 0.8, "2": grad_norm}}
        metrics = {k: {s: v for s, v in series.items() if int(s) >= first} for k, series in metrics.items()}
        (d / "metrics.json").write_text(json.dumps(metrics, indent=2))
    (d / "exit_status").write_text(f"{rc}\n")
    return d


def test_gpu_host_cell_judges_recorded_runs_with_the_grpo_gates_and_markers(demo, tmp_path):
    from carry.nightly import config as nightly_config
    shipped = nightly_config.load(ROOT / "integration" / "nightly.toml")
    spec = next(t for t in shipped.tests if t.name == "grpo-megatron-generation-gtp")
    assert "gpu-host" in spec.images and shipped.images["gpu-host"].functional
    recs = tmp_path / "recorded"
    runs = {
        "green": _recorded(recs, "green", rc=0, markers=(MARK_GTP, MARK_RESHARD), err=1.0004),
        "no-reshard": _recorded(recs, "no-reshard", rc=0, markers=(MARK_GTP,), err=1.0004),
        "red": _recorded(recs, "red", rc=1, markers=(MARK_GTP,), err=None,
                         extra="RuntimeError: supplied weight's shape is (512, 256), not (1024, 256)\n"),
        "gate": _recorded(recs, "gate", rc=0, markers=(MARK_GTP, MARK_RESHARD), err=1.1011),
        # Log-probs agree, but clipping an infinite gradient norm zeroed the update.
        "inf-norm": _recorded(recs, "inf-norm", rc=0, markers=(MARK_GTP, MARK_RESHARD), err=1.0004,
                              grad_norm=float("inf")),
    }
    (tmp_path / "replay.py").write_text(REPLAY)
    q = json.dumps
    images, tests = "", ""
    for name, folder in runs.items():
        argv = [sys.executable, str(tmp_path / "replay.py"), "{script}", "{out}", str(folder)]
        images += f'\n[images.rec-{name}]\nlauncher = "local"\nfunctional = [{", ".join(q(a) for a in argv)}]\n'
    tests = (f'\n[[tests]]\nname = {q(spec.name)}\nkind = "functional"\nimages = [{", ".join(q("rec-" + n) for n in runs)}]\n'
             f'script = {q(spec.script)}\ngates = [{", ".join(q(g.text) for g in spec.gates)}]\n'
             f'markers = [{", ".join(q(m) for m in spec.markers)}]\ntimeout_s = 120\n')
    config = tmp_path / "nightly.toml"
    config.write_text(f'[nightly]\nseries = [{q(str(demo["series"]))}]\n' + images + tests)
    out = tmp_path / "n"
    tool("nightly", "--config", config, "--out", out, "--workdir", tmp_path / "w", "--cache", demo["cache"],
         "--source", f"megatron-lm={demo['up']}", "--no-bisect", "--history", tmp_path / "h.jsonl", check=1)
    got = {r["image"].removeprefix("rec-"): r for r in read_json(out / "nightly.json")["runs"]}
    assert got["green"]["status"] == "passed", got["green"]["reason"]
    assert "1.0004" in got["green"]["reason"]
    assert got["no-reshard"]["status"] == "vacuous" and MARK_RESHARD in got["no-reshard"]["reason"]
    assert got["red"]["status"] == "failed" and "supplied weight's shape" in got["red"]["reason"]
    assert got["gate"]["status"] == "failed" and "1.1011" in got["gate"]["reason"]
    assert got["inf-norm"]["status"] == "failed" and "grad_norm" in got["inf-norm"]["reason"]
    arts = out / "cells" / "demo--rec-green--grpo-megatron-generation-gtp" / "artifacts"
    assert {"run.log", "metrics.json", "console.log"} <= {p.name for p in arts.iterdir()}


def test_case_summary_names_what_each_case_showed(tmp_path):
    """case.json's verdict: green needs exit 0, the gate and both markers; gtp-off is judged on its metric."""
    d = _recorded(tmp_path, "p", rc=0, markers=(MARK_GTP, MARK_RESHARD), err=1.003)
    got = caserun.summarize(casing.CASES["patched"], d, 0)
    assert got["observed"] == "green" and got["as_expected"] and got["gate_value"] == 1.003
    assert got["token_mult_prob_error_per_step"] == {"1": 1.0001, "2": 1.003}
    d = _recorded(tmp_path, "m", rc=1, markers=(MARK_GTP,), err=None,
                  extra="RuntimeError: supplied weight's shape is (512, 256), not (1024, 256)\n")
    got = caserun.summarize(casing.CASES["pristine-mcore"], d, 1)
    assert got["observed"] == "red" and got["as_expected"] and "supplied weight" in got["first_error"]
    # The FAIL line exactly as the patched script prints it (patch nrl 0004's require_marker), so that
    # a change of its wording cannot leave the control judged red (seen on the H200, 2026-12-02).
    script = next((SERIES / "nemo-rl").glob("0004-*.patch")).read_text()
    template = re.search(r'echo "(FAIL: no line of [^"]*)"', script).group(1)
    fail = (template.replace("$run_log", "/x/run.log").replace("$1", MARK_GTP)
            .replace("$2", "training ran without GTP weight sharding"))
    d = _recorded(tmp_path, "off", rc=1, markers=(), err=1.0002, extra=fail + "\n")
    got = caserun.summarize(casing.CASES["gtp-off"], d, 1)
    assert got["observed"] == "green" and got["gate_value"] == 1.0002 and got["as_expected"]
    # Every FAIL line of the control must quote a marker: the marker's FAIL beside one that quotes none
    # (the run failed for its own reason too) is red, though its metric is there.
    d = _recorded(tmp_path, "off-other-fail", rc=1, markers=(), err=1.0002,
                  extra=fail + "\nFAIL: token_mult_prob_error is missing from the metrics\n")
    other = caserun.summarize(casing.CASES["gtp-off"], d, 1)
    assert other["observed"] == "red" and not other["as_expected"], other
    d = _recorded(tmp_path, "off2", rc=1, markers=(), err=None, extra="ValueError: boom\n")
    assert caserun.summarize(casing.CASES["gtp-off"], d, 1)["observed"] == "red"
    # Exit 1 with its metric but without the marker's FAIL line (a crash after the metrics) is red too.
    d = _recorded(tmp_path, "off3", rc=1, markers=(), err=1.0002)
    assert caserun.summarize(casing.CASES["gtp-off"], d, 1)["observed"] == "red"
    # Clipping an infinite norm zeroes the update while log-probs agree: red all the same.
    d = _recorded(tmp_path, "inf", rc=0, markers=(MARK_GTP, MARK_RESHARD), err=1.003, grad_norm=float("inf"))
    got = caserun.summarize(casing.CASES["patched"], d, 0)
    assert got["observed"] == "red" and got["gate_value"] == 1.003
    grad = got["gates"]['max(data["train/grad_norm"]) < 1e30']
    assert grad["value"] == float("inf") and not grad["ok"]
    # Ray's metrics-agent noise and GRPO's step summary are not the run's first error.
    d = _recorded(tmp_path, "noise", rc=1, markers=(MARK_GTP,), err=None,
                  extra="Error fetching metrics from 192.0.2.2:-1: Failed to parse\n"
                        "  \u2022 Generation KL Error: 0.0001\n"
                        "ModuleNotFoundError: No module named 'flash_attn'\n")
    got = caserun.summarize(casing.CASES["patched"], d, 1)
    assert got["first_error"] == "ModuleNotFoundError: No module named 'flash_attn'"


@pytest.mark.parametrize("said", ["BUG_HIT: the tied weight reached the shard twice",
                                  "FAIL: the weights did not change"])
def test_a_run_that_says_it_failed_is_red_though_it_exited_0(tmp_path, said):
    """What the run says of its own outcome counts beside its exit status (the nightly judge's rule): every
    gate and marker held and the exit was 0, yet its log has a FAIL or BUG_HIT line: red, for that line."""
    d = _recorded(tmp_path, "said", rc=0, markers=(MARK_GTP, MARK_RESHARD), err=1.003, extra=said + "\n")
    got = caserun.summarize(casing.CASES["patched"], d, 0)
    assert all(g["ok"] for g in got["gates"].values()) and all(got["markers"].values()), got
    assert (got["observed"], got["as_expected"]) == ("red", False), got
    assert got["reasons"] == [f"the run said: {said}"], got["reasons"]
    # The GTP-off control reads its FAIL lines by its own rule (the marker's FAIL is expected there), but a
    # series bug met is red there too.
    if said.startswith("BUG_HIT:"):
        d = _recorded(tmp_path, "off-said", rc=0, markers=(), err=1.0002, extra=said + "\n")
        off = caserun.summarize(casing.CASES["gtp-off"], d, 0)
        assert off["observed"] == "red" and f"the run said: {said}" in off["reasons"], off
        d = _recorded(tmp_path, "off-quiet", rc=0, markers=(), err=1.0002)
        assert caserun.summarize(casing.CASES["gtp-off"], d, 0)["observed"] == "green"


def test_resume_starts_from_the_step_1_checkpoint_alone_and_must_run_step_2(tmp_path):
    from carry.errors import UsageError
    lay = hostsetup.Layout(parts=tmp_path / "parts", root=tmp_path / "root", te=tmp_path / "te")
    resume = casing.CASES["resume"]
    with pytest.raises(UsageError, match=r"no step_1 in .*\(there: nothing\)") as e:
        caserun.resume_folder(lay, resume)
    assert "run the patched case first" in e.value.hint
    for step in (1, 2):
        (lay.checkpoints / f"step_{step}" / "policy").mkdir(parents=True)
        (lay.checkpoints / f"step_{step}" / "policy" / "weights.bin").write_bytes(bytes([step]) * 64)
    (lay.resume_checkpoints / "step_9").mkdir(parents=True)   # a stale folder from an earlier call
    dest = caserun.resume_folder(lay, resume)
    assert sorted(p.name for p in dest.iterdir()) == ["step_1"]
    assert (dest / "step_1" / "policy" / "weights.bin").read_bytes() == bytes([1]) * 64
    assert (lay.checkpoints / "step_2").is_dir(), "the patched case's checkpoints stay as they were"
    # Green needs the run to go on at step 2: a run that starts over at step 1 did not resume.
    steps = "========================= Step {}/2 =========================\n"
    d = _recorded(tmp_path, "resumed", rc=0, markers=(MARK_GTP, MARK_RESHARD), err=1.003, extra=steps.format(2),
                  first=2)
    got = caserun.summarize(resume, d, 0)
    assert got["observed"] == "green" and got["steps_run"] == [2]
    d = _recorded(tmp_path, "restarted", rc=0, markers=(MARK_GTP, MARK_RESHARD), err=1.003,
                  extra=steps.format(1) + steps.format(2))
    got = caserun.summarize(resume, d, 0)
    assert got["observed"] == "red" and got["steps_run"] == [1, 2] and "resumed from step 1" in got["last_error"]


def test_run_on_gpu_host_without_its_parts_is_a_usage_error(tmp_path):
    res = subprocess.run([sys.executable, str(NRL / "run-on-gpu-host"), "--parts", str(tmp_path / "none"),
                          "--root", str(tmp_path / "root"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "no nrl ferry unpacked" in res.stderr and "recv.sh nrl" in res.stderr
    res = subprocess.run([sys.executable, str(NRL / "run-on-gpu-host"), "--skip-setup", "--root", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "no environment in" in res.stderr
    from carry.errors import UsageError
    with pytest.raises(UsageError, match="no built model in"):  # --skip-setup with a venv but no weights
        hostsetup.require_model(hostsetup.Layout(parts=tmp_path, root=tmp_path / "r", te=tmp_path))
    res = subprocess.run([sys.executable, str(NRL / "run-on-gpu-host"), "--cases", "patched,nope"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "unknown case(s): nope" in res.stderr
    res = subprocess.run([sys.executable, str(NRL / "run-on-gpu-host"), "--setup-only", "--skip-setup"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--setup-only and --skip-setup do not go together" in res.stderr


def test_nightly_megatron_tree_runs_with_the_pinned_wheels_compiled_helper(mcore_tree, pin_cache, tmp_path):
    """A tools/apply.py tree has the wheel's sources but not its compiled dataset helper; the gpu-host
    cell runs it from a copy that has the pinned wheel's, and leaves the tree as it was."""
    wheel = next((pin_cache / "artifacts").rglob("megatron_core-0.19.2-cp312-*.whl"))
    lay = hostsetup.Layout(parts=tmp_path / "parts", root=tmp_path / "root", te=tmp_path / "te")
    with pytest.raises(IntegrityError, match="one pinned megatron-core wheel"):
        caserun.with_compiled_parts(lay, mcore_tree)
    (lay.payload / "sources").mkdir(parents=True)
    shutil.copy2(wheel, lay.payload / "sources" / wheel.name)
    (lay.payload / "stage.json").write_text(json.dumps({"series": "gtp"}))   # the series the ferry was staged for
    assert not list(mcore_tree.rglob("*.so")), "apply leaves compiled files out of the tree"
    got = caserun.with_compiled_parts(lay, mcore_tree)
    assert got != mcore_tree and not list(mcore_tree.rglob("*.so"))
    with zipfile.ZipFile(wheel) as z:
        shipped = {n for n in z.namelist() if n.endswith(".so")}
    assert shipped and {str(p.relative_to(got)) for p in got.rglob("*.so")} == shipped
    assert (got / "megatron" / "core" / "datasets" / "utils.py").read_bytes() == \
        (mcore_tree / "megatron" / "core" / "datasets" / "utils.py").read_bytes()
    assert caserun.with_compiled_parts(lay, got) == got            # nothing missing: used as it is
    bridge = tmp_path / "bridge" / "src"
    (bridge / "megatron" / "bridge").mkdir(parents=True)
    assert caserun.with_compiled_parts(lay, bridge) == bridge      # not a megatron-core tree


def test_a_run_that_exited_non_zero_names_its_exit_status_among_its_reasons(tmp_path):
    """Gates and markers all hold, the run exited 1: red, and the exit status is the reason named (the
    replay of committed cases reads the reasons)."""
    d = _recorded(tmp_path, "exit1", rc=1, markers=(MARK_GTP, MARK_RESHARD), err=1.003)
    got = caserun.summarize(casing.CASES["patched"], d, 1)
    assert got["observed"] == "red" and got["reasons"] == ["exit status 1"], got["reasons"]
    assert caserun.summarize(casing.CASES["patched"], d, 0)["reasons"] == []
