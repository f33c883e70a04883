"""A committed GPU run's records kept as RUN/run.tar.xz and unpacked beside it (carry.evidence.records): lossless,
checked, never half-written, and what every reader of the runs sees."""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from helpers import ROOT, git

from carry.errors import IntegrityError, UsageError
from carry.evidence import records

EVIDENCE = ROOT / "integration"


def _run(tmp_path: Path, name: str = "r") -> Path:
    """A run folder as a device's evidence has it: ranks' records gzipped and plain, a result.json.gz, nested."""
    run = tmp_path / name
    launch = run / "run" / "megatron-lm" / "megatron-lm" / "patched" / "launch-01-n4"
    launch.mkdir(parents=True)
    for rank in range(4):
        lines = "".join(json.dumps({"ev": "deselected", "id": f"t{i}", "rank": rank}) + "\n" for i in range(300))
        (launch / f"rank-{rank}.jsonl.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))
    (launch / "command.txt").write_text("torchrun --nproc-per-node 4 -m pytest\n")
    (run / "run" / "megatron-lm" / "megatron-lm" / "result.json.gz").write_bytes(
        gzip.compress(json.dumps({"upstream": "megatron-lm", "rows": []}).encode()))
    (run / "run" / "environment.txt").write_text("torch==2.11.0\n")
    (run / "README.md").write_text("# a run\n")
    return run


def _contents(folder: Path) -> dict[str, bytes]:
    """Each file under FOLDER by its path, a gzipped one's content decompressed."""
    return {p.relative_to(folder).as_posix(): gzip.decompress(p.read_bytes()) if p.name.endswith(".gz")
            else p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_packed_and_unpacked_again_has_every_file_with_its_name_and_content(tmp_path):
    run = _run(tmp_path)
    before = _contents(run / "run")
    archive = records.pack(run)
    assert archive == run / "run.tar.xz" and (run / "run").is_dir()   # packing keeps the folder
    assert archive.stat().st_size < sum(len(v) for v in before.values()) / 4   # the ranks' repeats told once
    packed_again = records.pack(run)   # deterministic: no times, owners or order of the disk in it
    assert packed_again.read_bytes() == archive.read_bytes()
    os.rename(run / "run", tmp_path / "old")
    assert records.unpack(archive) == run / "run"
    assert _contents(run / "run") == before   # the same names (.gz kept), the same content
    assert records.members(archive) == sorted(before)
    # the archive alone goes into git: the folder it unpacks to, and its stamp, are what git ignores there
    (run / "run" / "environment.txt").write_text("edited\n")
    records.unpack(archive)   # stamped from this very archive: left as it is
    assert (run / "run" / "environment.txt").read_text() == "edited\n"


def test_a_folder_unpacked_from_another_archive_or_never_stamped_is_replaced_not_merged(tmp_path):
    """Mutation, red here: the stamp's digest never compared (any stamped folder left as it is)."""
    run = _run(tmp_path)
    old = records._sha(records.pack(run).read_bytes())
    (run / "run" / "environment.txt").write_text("torch==2.12.0\n")
    archive = records.pack(run)   # a newer archive (a pull brought it): the folder of the older one goes
    (run / records.STAMP).write_text(old + "\n")   # the folder as the older archive unpacked and stamped it
    (run / "run" / "environment.txt").write_text("torch==2.11.0\n")
    (run / "run" / "stray.txt").write_text("only the old folder had this\n")
    records.unpack(archive)
    assert not (run / "run" / "stray.txt").exists() and (run / "run" / "environment.txt").read_text() == "torch==2.12.0\n"
    (run / records.STAMP).unlink()   # a folder never stamped (unpacked by hand, or cut half-way): replaced as well
    (run / "run" / "stray.txt").write_text("x\n")
    records.unpack(archive)
    assert not (run / "run" / "stray.txt").exists()


def _rewritten(archive: Path, change) -> None:
    """ARCHIVE with its tar's members changed by CHANGE (a list of (TarInfo, bytes), edited in place)."""
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(archive.read_bytes())), mode="r:") as tf:
        items = [(i, tf.extractfile(i).read() if i.isfile() else b"") for i in tf.getmembers()]
    change(items)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in items:
            info.size = len(data) if info.isfile() else 0
            tf.addfile(info, io.BytesIO(data) if info.isfile() else None)
    archive.write_bytes(lzma.compress(buf.getvalue()))


def _edit_member(name: str, data: bytes):
    def change(items):
        for k, (info, _) in enumerate(items):
            if info.name == name:
                items[k] = (info, data)
    return change


def _drop_member(name: str):
    def change(items):
        items[:] = [x for x in items if x[0].name != name]
    return change


def _add_member(name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, link: str = ""):
    def change(items):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        items.append((info, data))
    return change


@pytest.mark.parametrize("change, says", [
    (_edit_member("environment.txt", b"torch==9\n"), "environment.txt: sha256 .*, the manifest says"),
    (_drop_member("environment.txt"), "environment.txt: in the manifest, not in the archive"),
    (_add_member("extra.txt"), "extra.txt: in the archive, not in the manifest"),
    (_add_member("../outside.txt"), "not a plain file inside the folder"),
    (_add_member("/carry-records-test/outside.txt"), "not a plain file inside the folder"),
    (_add_member("link", b"", tarfile.SYMTYPE, "/carry-records-test"), "not a plain file inside the folder"),
], ids=["content", "missing", "unlisted", "dotdot", "absolute", "link"])
def test_an_archive_that_does_not_verify_unpacks_nothing_and_leaves_the_folder_there(tmp_path, change, says):
    """Mutation, red here: the sha256 never compared (content), the archive's other members never checked against the
    manifest (unlisted), the member's path never checked (dotdot, absolute, link)."""
    run = _run(tmp_path)
    archive = records.pack(run)
    _rewritten(archive, change)
    before = _contents(run / "run")
    (run / records.STAMP).unlink()
    with pytest.raises(IntegrityError, match=says):
        records.unpack(archive)
    assert _contents(run / "run") == before   # the folder there is left whole
    assert sorted(p.name for p in run.iterdir()) == ["README.md", "run", "run.tar.xz"]   # nothing half-written beside
    assert not (tmp_path / "outside.txt").exists()


def test_packing_refuses_what_one_archive_name_would_hold_twice_and_a_folder_that_is_not_there(tmp_path):
    run = _run(tmp_path)
    (run / "run" / "environment.txt.gz").write_bytes(gzip.compress(b"other\n"))
    with pytest.raises(UsageError, match="one archive name would hold two"):
        records.pack(run)
    assert not (run / "run.tar.xz").exists()
    with pytest.raises(UsageError, match="no such folder to pack"):
        records.pack(tmp_path / "nothing")


def test_a_compared_result_in_a_run_not_unpacked_yet_is_read_from_its_archive(tmp_path):
    """--compared names RUN/run/.../result.json.gz (as committed_results lists it); a fresh clone has only the
    archive: the tool unpacks it first. Mutation, red here: _result without unpacked_for."""
    from carry.commands.upstream_tests import _result
    run = _run(tmp_path)
    records.pack(run)
    result = run / "run" / "megatron-lm" / "megatron-lm" / "result.json.gz"
    os.rename(run / "run", tmp_path / "old")
    doc = _result(result)
    assert doc["upstream"] == "megatron-lm" and result.is_file()


def test_the_gpu_script_unpacks_the_committed_runs_before_it_lists_their_results(tmp_path):
    """committed_results and compared_args (shared-gpu-lib.sh) on a checkout whose runs are archives only, with a
    Python that has no carry installed (any python3: the module needs the stdlib alone). Mutations, red here:
    unpack_runs not called by committed_results, nor by compared_args (whose loop loses committed_results' status)."""
    run = _run(tmp_path / "integration" / "h100", "2026-12-31-a")
    records.pack(run)
    os.rename(run / "run", tmp_path / "old")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = "integration/h100/2026-12-31-a/run/megatron-lm/megatron-lm/result.json.gz"
    for step, says in (("committed_results megatron-lm", f"{result}\n"), ("compared_args megatron-lm", f"--compared\0{result}\0")):
        shutil.rmtree(run / "run", ignore_errors=True)
        out = subprocess.run(["bash", "-c", f". {ROOT}/integration/shared-gpu-lib.sh && {step}"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
        assert out.stdout == says and (run / "run" / "environment.txt").is_file(), step
    _rewritten(run / "run.tar.xz", _edit_member("environment.txt", b"tampered\n"))   # one that does not verify
    for step in ("unpack_runs", "compared_args megatron-lm"):   # its failure is compared_args' own, not lost
        failed = subprocess.run(["bash", "-c", f". {ROOT}/integration/shared-gpu-lib.sh && {step}"],
                                cwd=tmp_path, env=env, capture_output=True, text=True)
        assert failed.returncode == 1 and "environment.txt: sha256" in failed.stderr and not failed.stdout, step


def test_the_committed_runs_are_archives_whose_records_verify_and_git_keeps_no_file_of_their_folders():
    """Every integration/h100 run with records is an archive git keeps, its run/ folder none of git's; each archive
    verifies against its manifest, and what the tests read (conftest unpacked them) is what it holds."""
    archives = sorted(EVIDENCE.glob("h100/*/run.tar.xz"))
    assert len(archives) >= 17, archives
    tracked = git(ROOT, "ls-files", "integration/h100").splitlines()
    assert not [f for f in tracked if "/run/" in f], "a run's records go into its run.tar.xz"
    assert {f"integration/h100/{a.parent.name}/run.tar.xz" for a in archives} <= set(tracked)
    ignored = subprocess.run(["git", "check-ignore", "-q", f"integration/h100/{archives[0].parent.name}/run/x"],
                             cwd=ROOT).returncode
    assert ignored == 0
    for archive in archives:
        files = records._verified(lzma.decompress(archive.read_bytes()))
        assert len(files) > 10, archive
        folder = archive.parent / "run"
        assert {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} == set(files), archive


def test_the_house_check_for_consoles_sees_inside_a_runs_archive(tmp_path):
    """test_house's evidence_files lists an archive's members: a console packed into one is caught as a tracked
    one is. Mutation, red here: evidence_files without the archives' members."""
    from test_house import consoles_in, evidence_files
    from carry.git import Git
    repo = tmp_path / "repo"
    Git(repo).init()
    run = _run(repo / "integration" / "h100", "2026-12-31-a")
    (run / "run" / "megatron-lm" / "megatron-lm" / "patched" / "launch-01-n4" / "console.log").write_text("def test_x():\n")
    records.pack(run)
    subprocess.run(["git", "add", "integration/h100/2026-12-31-a/run.tar.xz"], cwd=repo, check=True)
    assert consoles_in(evidence_files(repo)) == [
        "integration/h100/2026-12-31-a/run/megatron-lm/megatron-lm/patched/launch-01-n4/console.log"]


def test_the_module_run_by_hand_explains_itself_and_exits_as_every_command_does(tmp_path, capsys):
    """0 done (or --help), 1 an archive that does not verify (nothing unpacked), 2 bad usage."""
    assert records.main(["--help"]) == 0 and "unpack [ROOT]" in capsys.readouterr().out
    assert records.main(["bogus"]) == 2 and "usage:" in capsys.readouterr().err
    assert records.main(["pack", str(tmp_path / "nothing")]) == 2 and "no such folder" in capsys.readouterr().err
    run = _run(tmp_path / "integration" / "h100", "a")
    records.pack(run)
    _rewritten(run / "run.tar.xz", _edit_member("environment.txt", b"x\n"))
    (run / records.STAMP).unlink()
    assert records.main(["unpack", str(tmp_path / "integration")]) == 1 and "sha256" in capsys.readouterr().err


def test_two_unpacks_at_once_take_turns_on_the_archive(tmp_path):
    """Two test sessions in one checkout unpacking the same run: the second waits for the first's lock on the
    archive, then finds the folder stamped. Mutation, red here: unpack without the lock."""
    import fcntl
    import threading
    run = _run(tmp_path)
    archive = records.pack(run)
    (run / records.STAMP).unlink()
    done = threading.Event()
    with open(archive, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)   # another session, in the middle of its unpack
        worker = threading.Thread(target=lambda: (records.unpack(archive), done.set()))
        worker.start()
        assert not done.wait(1.0), "it wrote while another held the archive"
    worker.join(30)
    assert done.is_set() and (run / records.STAMP).is_file()


def test_an_unpack_cut_half_way_leaves_nothing_beside_and_the_folder_there_whole(tmp_path, monkeypatch):
    """A write that fails half-way (a full disk): the half-written folder goes, the one there stays as it was, the
    stamp untouched. Mutation, red here: no clean-up of the folder being written."""
    run = _run(tmp_path)
    archive = records.pack(run)
    before, stamp = _contents(run / "run"), (run / records.STAMP).read_text()
    (run / records.STAMP).write_text("another archive's\n")
    real, calls = Path.write_bytes, []

    def full_disk(self, data):
        calls.append(self)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", str(self))
        return real(self, data)
    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(OSError, match="No space left"):
        records.unpack(archive)
    monkeypatch.undo()
    assert sorted(p.name for p in run.iterdir()) == [records.STAMP, "README.md", "run", "run.tar.xz"]
    assert _contents(run / "run") == before and (run / records.STAMP).read_text() == "another archive's\n" != stamp
