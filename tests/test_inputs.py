"""Bad inputs a user can give: each is refused with `error:` and an exit code, never a traceback.

apply and lint read the series through one validation (the manifest loader), so apply never
accepts what lint rejects. Paths that are the wrong kind of thing (a file where a folder is
needed, a folder where a file is) and broken files name what is wrong and exit 2.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import TOOLS, tool, which
from helpers import apply_demo as apply


def _refused(res, *words):
    """Exit 2, an `error:` line naming every word, and no traceback."""
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out, out
    assert "error: " in res.stderr, out
    for w in words:
        assert w in res.stderr, (w, out)


def _set(demo, old, new):
    toml = demo["series"] / "series.toml"
    text = toml.read_text()
    assert old in text
    toml.write_text(text.replace(old, new, 1))


# -- item 9: one validation for lint and apply ------------------------------------------------
@pytest.mark.parametrize("old,new,named", [
    ('file = "megatron-lm/0001-clean.patch"', 'file = "megatron-lm/../outside/0001-clean.patch"',
     "outside the series folder"),
    ('file = "megatron-lm/0002-threeway.patch"', 'file = "megatron-lm/0001-clean.patch"',
     "also listed by clean"),
    ('id = "clean"', 'id = "clé"', "lowercase kebab-case"),
    ('id = "clean"', 'id = "clean,threeway"', "lowercase kebab-case"),
    ('id = "clean"', 'id = "megatron-lm"', "equals an upstream name"),
])
def test_apply_refuses_what_lint_refuses(demo, old, new, named):
    if "outside" in new:
        out = demo["series"] / "outside"
        out.mkdir()
        shutil.copy(demo["series"] / "megatron-lm" / "0001-clean.patch", out / "0001-clean.patch")
    _set(demo, old, new)
    lint = tool("lint", "--series", demo["series"])
    assert lint.returncode in (1, 2) and named in lint.stderr, lint.stdout + lint.stderr
    res = apply(demo)
    _refused(res, named, "tools/lint.py --series")
    assert not demo["work"].exists()


def _link_outside(demo):
    """The listed patch file is a symbolic link to a copy outside the series folder."""
    patch = demo["series"] / "megatron-lm" / "0001-clean.patch"
    outside = demo["tmp"] / "elsewhere.patch"
    shutil.copy(patch, outside)
    patch.unlink()
    patch.symlink_to(outside)


def _other_folder(demo):
    """The patch file sits in a folder of the series that is not its upstream's."""
    (demo["series"] / "other").mkdir()
    shutil.move(demo["series"] / "megatron-lm" / "0001-clean.patch", demo["series"] / "other" / "0001-clean.patch")
    _set(demo, 'file = "megatron-lm/0001-clean.patch"', 'file = "other/0001-clean.patch"')


def _requires_itself(demo):
    _set(demo, 'id = "clean"', 'id = "clean"\nrequires = ["clean"]')


@pytest.mark.parametrize("make,named", [
    (_link_outside, "file megatron-lm/0001-clean.patch is a link to outside the series folder"),
    (_other_folder, "file 'other/0001-clean.patch' must be megatron-lm/<name>.patch"),
    (_requires_itself, "patch clean: requires itself"),
], ids=["link-outside", "other-folder", "requires-itself"])
def test_lint_and_apply_refuse_an_entry_that_one_rule_alone_catches(demo, make, named):
    """Entries no other rule catches: lint reports them as bad configuration (exit 2), apply refuses them."""
    make(demo)
    lint = tool("lint", "--series", demo["series"], check=2)
    assert named in lint.stderr, lint.stdout + lint.stderr
    _refused(apply(demo), named, "tools/lint.py --series")
    assert not demo["work"].exists()


def test_a_patch_may_require_one_of_another_upstream_listed_after_it(tmp_path):
    """"Comes later" is a rule of one upstream's series: the series applies each upstream's patches in their own
    tree, so a Megatron-LM patch that requires a Bridge patch listed after it is no problem; within one
    upstream it is."""
    from helpers import SERIES

    series = tmp_path / "gtp"
    shutil.copytree(SERIES, series, ignore=shutil.ignore_patterns("__pycache__"))
    toml = series / "series.toml"
    text = toml.read_text()
    head = 'id = "mlm-pg-collection"\n'
    start = text.index(head)
    own = text.index("requires = []", start)
    toml.write_text(text[:own] + 'requires = ["bridge-ckpt-replica-groups"]' + text[own + len("requires = []"):])
    res = tool("lint", "--series", series, check=0)
    assert "comes later" not in res.stdout + res.stderr, res.stdout + res.stderr
    text = toml.read_text()
    toml.write_text(text.replace('requires = ["bridge-ckpt-replica-groups"]', 'requires = ["mlm-inference-pg"]', 1))
    res = tool("lint", "--series", series, check=2)
    assert "requires mlm-inference-pg, which comes later in the same upstream's series" in res.stderr, res.stderr


# -- issue 41 item 8: an id too long for the file names made from it --------------------------------
def _long_id(demo, length: int) -> str:
    """Patch clean renamed to an id of ``length`` bytes, its proof the GOOD one (proofs/megatron_lm/test_good.py)."""
    from fakeup import GOOD, add_proofs
    from helpers import SERIES

    pid = ("clean-" + "x" * length)[:length]
    add_proofs(demo["series"], {"good": GOOD}, {"clean": "good"}, SERIES / "proofs" / "pytest.ini")
    _set(demo, 'id = "clean"', f'id = "{pid}"')
    return pid


# The longest name prove makes from an id: its log, "<id>.<proof's stem>.<pristine|patched>.log".
_LONGEST_SUFFIX = len(".test_good.pristine.log")


def test_an_id_at_the_longest_the_file_names_allow_proves(demo, tmp_path):
    pid = _long_id(demo, 255 - _LONGEST_SUFFIX)
    tool("lint", "--series", demo["series"], check=0)
    apply(demo, check=0)
    res = tool("prove", "--series", demo["series"], "--workdir", demo["work"], "--only", pid, "--logs", tmp_path / "logs")
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(f"{pid}.test_good.pristine.log") == 255 and (tmp_path / "logs" / f"{pid}.test_good.pristine.log").is_file()


def test_an_id_one_byte_longer_is_refused_by_every_command(demo, tmp_path):
    pid = _long_id(demo, 256 - _LONGEST_SUFFIX)
    lint = tool("lint", "--series", demo["series"], check=2)
    assert f"patch {pid}: id is {len(pid)} bytes" in lint.stderr and "at most 232" in lint.stderr, lint.stderr
    _refused(apply(demo), "at most 232")
    assert not demo["work"].exists()


# -- item 12: the wrong kind of file ------------------------------------------------------------
def test_series_toml_that_is_not_utf8_or_a_folder(demo):
    toml = demo["series"] / "series.toml"
    toml.write_bytes(toml.read_bytes().replace(b"test series", b"test s\xe9ries"))
    _refused(apply(demo), "series.toml", "UTF-8")
    _refused(tool("lint", "--series", demo["series"]), "UTF-8")
    toml.unlink()
    toml.mkdir()
    _refused(apply(demo), "series.toml", "is a directory")


def test_patch_file_that_is_a_folder(demo):
    p = demo["series"] / "megatron-lm" / "0001-clean.patch"
    p.unlink()
    p.mkdir()
    _refused(apply(demo), "0001-clean.patch", "is a directory")
    lint = tool("lint", "--series", demo["series"], check=2)  # what every other command refuses as bad input
    assert "0001-clean.patch is a directory" in lint.stderr


# -- issue 41 item 8: a path read as a file that is not a regular file ------------------------------
def _every_command(demo, tmp_path) -> dict[str, list]:
    """Each command that reads the series, with what it needs besides --series."""
    return {
        "lint": [],
        "apply": ["--workdir", demo["work"], "--cache", demo["cache"], "--source", f"megatron-lm={demo['up']}"],
        "export": ["--workdir", demo["work"], "--check"],
        "prove": ["--workdir", demo["work"]],
        "retire": ["--against", f"megatron-lm={demo['v1']}", "--source", f"megatron-lm={demo['up']}",
                   "--cache", demo["cache"]],
        "rebase": ["--onto", f"megatron-lm={demo['v1']}", "--source", f"megatron-lm={demo['up']}",
                   "--cache", demo["cache"], "--workdir", tmp_path / "rw"],
    }


_NOT_FILES = {
    "patch": lambda s: s / "megatron-lm" / "0001-clean.patch",
    "series.toml": lambda s: s / "series.toml",
    "proof": lambda s: s / "proofs" / "megatron_lm" / "test_good.py",
    "requirements": lambda s: s / "proofs" / "megatron_lm" / "requirements.txt",
}


@pytest.mark.parametrize("what", sorted(_NOT_FILES))
def test_a_fifo_is_refused_at_once_by_every_command(demo, tmp_path, what):
    """A FIFO where the series has a file would block its reader for ever: exit 2, at once."""
    from fakeup import GOOD, add_proofs
    from helpers import SERIES

    add_proofs(demo["series"], {"good": GOOD}, {"clean": "good"}, SERIES / "proofs" / "pytest.ini")
    apply(demo, check=0)
    target = _NOT_FILES[what](demo["series"])
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    for verb, args in _every_command(demo, tmp_path).items():
        res = tool(verb, "--series", demo["series"], *args, timeout=30)
        if verb == "lint" and what != "series.toml":  # lint lists it among its problems
            assert res.returncode == 2 and f"{target.name} is a FIFO, not a regular file" in res.stderr, res.stderr
        else:
            _refused(res, target.name, "a FIFO, not a regular file")
        assert target.exists(), verb
    assert not (tmp_path / "rw").exists()


def test_a_socket_as_the_nightly_matrix_is_refused(tmp_path):
    import socket

    where = tmp_path / "nightly.toml"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(where))
        res = tool("nightly", "--config", where, "--out", tmp_path / "o", timeout=30)
    _refused(res, "nightly.toml", "a socket, not a regular file")


def test_workdir_that_is_a_file_or_under_one(demo, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    for wd in (f, f / "under"):
        res = tool("apply", "--series", demo["series"], "--workdir", wd, "--cache", demo["cache"],
                   "--source", f"megatron-lm={demo['up']}")
        _refused(res, "--workdir", str(wd), "not a directory")
    assert f.read_text() == "x"


def test_cache_that_is_a_file(demo, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", f,
               "--source", f"megatron-lm={demo['up']}")
    _refused(res, "--cache", str(f), "not a directory")
    assert not demo["work"].exists()


def test_lock_that_is_a_folder(demo):
    apply(demo, check=0)
    (demo["work"] / ".carry" / "lock").mkdir()
    _refused(apply(demo), str(demo["work"] / ".carry" / "lock"), "is a directory")


def test_corrupt_wheel_given_to_source(tmp_path, pin_cache):
    bad = tmp_path / "megatron_core-0.19.2-cp312-cp312-manylinux_2_28_x86_64.whl"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    res = tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", tmp_path / "c",
               "--only", "megatron-lm", "--source", f"megatron-lm={bad}")
    _refused(res, str(bad), "not a valid wheel")
    assert not (tmp_path / "w").exists()


def test_cached_artifact_path_that_is_a_folder(tmp_path):
    """The pinned wheel's place in the cache is a folder: named, exit 2, no traceback."""
    from carry.series.repo import load_series

    up = load_series("gtp").upstream("megatron-bridge")
    art = up.pypi.tree_artifact
    (tmp_path / "c" / "artifacts" / art.sha256 / art.file).mkdir(parents=True)
    res = tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", tmp_path / "c",
               "--only", "megatron-bridge")
    _refused(res, art.file, "is a directory")


# -- item 16: an unknown flag is named ---------------------------------------------------------
@pytest.mark.parametrize("verb", ["apply", "prove", "export", "retire", "rebase", "lint", "build_image", "nightly"])
def test_an_unknown_flag_is_named_before_missing_ones(verb):
    res = tool(verb, "--bogus")
    _refused(res, "unrecognized arguments: --bogus")
    assert "required" not in res.stderr


def test_a_missing_flag_is_still_named():
    _refused(tool("apply"), "the following arguments are required: --workdir")


# -- item 12: full disks, read-only mounts, no permission (real mounts; root only) ---------------
@pytest.fixture
def mount(tmp_path):
    """mount(args, where): a real mount at ``where`` for this test (skipped where mounting is not allowed)."""
    done = []

    def do(args, where):
        where.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(["mount", *args, str(where)], capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot mount here ({res.stderr.strip() or 'not root'}): needs root")
        done.append(where)
        return where

    yield do
    for where in reversed(done):
        subprocess.run(["umount", "-l", str(where)], check=False)


def _small_disk(mount, where, size_kb, free_kb):
    mount(["-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs"], where)
    st = os.statvfs(where)
    fill = st.f_bavail * st.f_frsize - free_kb * 1024
    if fill > 0:
        (where / "fill").write_bytes(b"\0" * fill)
    return where


@pytest.mark.network
def test_disk_full_while_downloading_is_named_so(tmp_path, mount):
    """About 1 MB free for a cold cache: a full disk, not "no source could be reached"."""
    small = _small_disk(mount, tmp_path / "small", 3072, 1024)
    res = tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", small / "cache",
               "--only", "megatron-lm")
    _refused(res, "no space left on the device", str(small / "cache"))
    assert "no source could be reached" not in res.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.network
def test_disk_full_while_unpacking_is_named_so(tmp_path, mount, pin_cache):
    """The pinned wheel is in the cache, its unpacked tree does not fit beside it."""
    from carry.workspace.artifacts import fetch_artifact
    from carry.series.repo import load_series

    up = load_series("gtp").upstream("megatron-bridge")
    art = up.pypi.tree_artifact
    wheel = fetch_artifact(up.name, up.pypi, art, pin_cache)
    small = _small_disk(mount, tmp_path / "small", 4096, 4096)
    (small / "cache" / "artifacts" / art.sha256).mkdir(parents=True)
    shutil.copy(wheel, small / "cache" / "artifacts" / art.sha256 / art.file)
    res = tool("apply", "--series", "gtp", "--workdir", tmp_path / "w", "--cache", small / "cache",
               "--only", "megatron-bridge")
    _refused(res, "no space left on the device")
    assert not (tmp_path / "w").exists()
    assert not list((small / "cache" / "bases").glob("*/*.git")), "a half-built base was kept"


def test_read_only_workdir_is_named(demo, tmp_path, mount):
    ro = tmp_path / "ro"
    ro.mkdir()
    mount(["--bind", str(ro)], ro)
    mount(["-o", "remount,ro,bind"], ro)
    res = tool("apply", "--series", demo["series"], "--workdir", ro / "w", "--cache", demo["cache"],
               "--source", f"megatron-lm={demo['up']}")
    _refused(res, "read-only file system", str(ro / "w"))


def test_permission_denied_is_named(demo, tmp_path):
    """A work directory the user may not write in (root without its override of file permissions)."""
    if os.geteuid() != 0 or not which("setpriv"):
        pytest.skip("needs root and setpriv to drop the permission override")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    drop = ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]
    res = subprocess.run([*drop, sys.executable, str(TOOLS / "apply.py"), "--series", str(demo["series"]),
                          "--workdir", str(theirs / "w"), "--cache", str(demo["cache"]),
                          "--source", f"megatron-lm={demo['up']}"], capture_output=True, text=True, timeout=300)
    _refused(res, "permission denied", str(theirs / "w"))


# -- item 10: a patch to a file the upstream lacks ------------------------------------------------
def _ghost_patches(demo):
    """'adds' creates megatron/core/epsilon.py (a copy of alpha.py); 'ghost' then edits it."""
    from carry.workspace.export import format_patch
    from carry.git import Git
    from fakeup import edit, patch_entry, series_toml

    up, g = demo["up"], Git(demo["up"])
    g("checkout", "-q", "--detach", demo["v0"])
    (up / "megatron/core/epsilon.py").write_text((up / "megatron/core/alpha.py").read_text())
    adds = g.commit_all("demo: add epsilon")
    edit(up, "megatron/core/epsilon.py", 5, "value_5 = 'ghost'\n")
    ghost = g.commit_all("demo: edit epsilon")
    g("checkout", "-q", "main")
    for name, commit in (("0005-adds.patch", adds), ("0006-ghost.patch", ghost)):
        (demo["series"] / "megatron-lm" / name).write_bytes(format_patch(up, commit))

    def write(ids):
        files = {"clean": "0001-clean.patch", "adds": "0005-adds.patch", "ghost": "0006-ghost.patch"}
        entries = [patch_entry(i, f"megatron-lm/{files[i]}") for i in ids]
        (demo["series"] / "series.toml").write_text(series_toml(demo["v0"], "https://example.invalid/x.git", entries))
        for name in ("0002-threeway.patch", "0003-upstreamed.patch", "0004-conflict.patch"):
            (demo["series"] / "megatron-lm" / name).unlink(missing_ok=True)
        for name in set(files.values()) - {files[i] for i in ids}:
            (demo["series"] / "megatron-lm" / name).rename(demo["tmp"] / name)
    return write


def test_a_patch_to_a_file_the_base_lacks_is_refused(demo):
    write = _ghost_patches(demo)
    write(["clean", "ghost"])
    res = apply(demo, "--json", demo["tmp"] / "r.json")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "patch ghost (megatron-lm/0006-ghost.patch) does not apply" in res.stderr, out
    assert "megatron/core/epsilon.py, which the tree it applies to does not have" in res.stderr, out
    assert "applied with a 3-way merge" not in res.stdout
    assert not demo["work"].exists(), "a refused first run leaves no work/"


def test_a_patch_may_edit_a_file_an_earlier_patch_creates(demo):
    write = _ghost_patches(demo)
    write(["clean", "adds", "ghost"])
    apply(demo, check=0)
    ws = demo["work"] / "megatron-lm"
    assert "value_5 = 'ghost'" in (ws / "megatron/core/epsilon.py").read_text()
    assert "ghost" not in (ws / "megatron/core/alpha.py").read_text()


# -- item 15: a checkout owned by another user -------------------------------------------------------
def test_a_checkout_owned_by_another_user_is_named_with_the_fix(demo, tmp_path):
    """git refuses it ("dubious ownership"): that is said, with the fix, not "lacks the pinned commit"."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the checkout to another user")
    theirs = tmp_path / "theirs"
    shutil.copytree(demo["up"], theirs)
    for root, dirs, files in os.walk(theirs):
        for name in dirs + files:
            os.chown(os.path.join(root, name), 65534, 65534)
    os.chown(theirs, 65534, 65534)
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
               "--source", f"megatron-lm={theirs}")
    _refused(res, str(theirs), "owned by another user", "safe.directory")
    assert "does not contain the pinned commit" not in res.stderr
    # The fix it names works: the user's own safe.directory is honoured.
    cfg = tmp_path / "gitconfig"
    cfg.write_text(f"[safe]\n\tdirectory = {theirs}\n")
    res = tool("apply", "--series", demo["series"], "--workdir", demo["work"], "--cache", demo["cache"],
               "--source", f"megatron-lm={theirs}", env={"GIT_CONFIG_GLOBAL": str(cfg)}, check=0)


def test_a_rebase_onto_a_base_that_moved_the_file_stops_for_a_person(demo, tmp_path):
    """The new base renamed the patch's file: no silent 3-way rename; the hint's way through works."""
    from carry.git import Git, git_env
    from fakeup import edit

    g = Git(demo["up"])
    g("mv", "megatron/core/alpha.py", "megatron/core/alpha2.py")
    moved = g.commit_all("upstream renames alpha")
    demo["write_series"](demo["v0"], ids=("clean",))
    args = ["--series", demo["series"], "--onto", f"megatron-lm={moved}", "--source", f"megatron-lm={demo['up']}",
            "--cache", demo["cache"], "--workdir", tmp_path / "rw"]
    res = tool("rebase", *args, check=1)
    assert "megatron/core/alpha.py, which the tree it applies to does not have" in res.stdout, res.stdout
    ws = tmp_path / "rw" / "megatron-lm"
    assert Git(ws).head() == moved, "the patch was applied to another file"
    assert "make clean's change by hand" in res.stderr, res.stderr
    # the hint's commit takes a new file too (git commit -a would leave it out of the patch)
    (commit,) = re.findall(r"`([^`]*add -A[^`]*commit -m SUBJECT)`", res.stderr)
    edit(ws, "megatron/core/alpha2.py", 5, "value_5 = 'patched'\n")
    (ws / "megatron/core/alpha_note.py").write_text("note = 1\n")
    subprocess.run(commit.replace("SUBJECT", "'demo: clean change'"), shell=True, check=True, env=git_env())
    tool("rebase", *args, "--continue", check=0)
    patch = (demo["series"] / "megatron-lm/0001-clean.patch").read_text()
    assert "+++ b/megatron/core/alpha2.py" in patch and "+++ b/megatron/core/alpha_note.py" in patch
