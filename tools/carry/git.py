"""git verbs on the one runner (carry.runner.run): ``Git``, and the pinned configuration every
git command runs with.

Every git call passes ``-C`` and pinned ``-c`` options so results do not
depend on the user's configuration (pager, signing, identity, diff style).
The one setting taken from it is ``safe.directory``: which repositories owned
by someone else the user trusts changes no result, only whether git works.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

from .errors import CommandError, full_disk_in_output
from .runner import Result, run

# Fixed identity and date for every commit the tool makes, so heads are
# reproducible from the same base and series.
IDENTITY_NAME = "gtp-carry"
IDENTITY_EMAIL = "gtp-carry@invalid"
FIXED_DATE = "2000-01-01T00:00:00+0000"

_GIT_CONFIG = (
    "core.pager=cat",
    "core.autocrlf=false",
    "core.safecrlf=false",
    # The user's own attributes file ($XDG_CONFIG_HOME/git/attributes), which git reads whatever
    # the config: a ``-diff`` there would make export write a binary section for a text change.
    f"core.attributesFile={os.devnull}",
    "core.fileMode=true",
    "core.symlinks=true",
    "core.quotePath=false",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.detachedHead=false",
    "init.defaultBranch=main",
    "diff.algorithm=myers",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.renames=true",
    "diff.external=",
    "am.threeWay=false",
    "am.keepcr=false",
    "apply.whitespace=nowarn",
    "format.signature=",
    "format.numbered=false",
    f"user.name={IDENTITY_NAME}",
    f"user.email={IDENTITY_EMAIL}",
    "rerere.enabled=false",
    # A checkout's own submodule.recurse would make the tool's checkout and reset --hard write
    # into its submodules' working trees, over work no check of the outer tree sees.
    "submodule.recurse=false",
    "uploadpack.allowAnySHA1InWant=true",
    "protocol.file.allow=always",
)


# What would point a git run at another repository, index or config than the one it is run in.
_ELSEWHERE = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR",
              "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_CONFIG")


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        # A user's GIT_DIR / GIT_WORK_TREE / GIT_INDEX_FILE would redirect us.
        if key.startswith("GIT_") and key not in ("GIT_SSL_CAINFO", "GIT_TRACE"):
            del env[key]
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=_trust_config(),
        GIT_TERMINAL_PROMPT="0",
        GIT_AUTHOR_NAME=IDENTITY_NAME,
        GIT_AUTHOR_EMAIL=IDENTITY_EMAIL,
        GIT_COMMITTER_NAME=IDENTITY_NAME,
        GIT_COMMITTER_EMAIL=IDENTITY_EMAIL,
        GIT_AUTHOR_DATE=FIXED_DATE,
        GIT_COMMITTER_DATE=FIXED_DATE,
        LC_ALL="C",
    )
    if extra:
        env.update(extra)
    return env


@functools.lru_cache(maxsize=1)
def trusted_directories() -> tuple[str, ...]:
    """``safe.directory`` from the user's own (global and system) git config: git_env hides
    those files, and with them the trust the user gave repositories owned by others."""
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_CONFIG")}
    found: list[str] = []
    try:  # one process for both scopes: each line says its scope (a repository's own lines are left out)
        res = run(["git", "config", "--show-scope", "--get-all", "safe.directory"], env=env, check=False,
                  timeout=60, cwd=os.path.expanduser("~"))
    except (CommandError, OSError):  # not installed, or it hung
        return ()
    for scoped in res.stdout.splitlines():
        scope, _, line = scoped.partition("\t")
        if scope not in ("global", "system"):
            continue
        # A clone reads the source through its git dir, which git checks as a path of its own:
        # trusting a checkout trusts its .git too.
        found += [line] if line in ("*", "") or line.endswith("/.git") else [line, line.rstrip("/") + "/.git"]
    return tuple(found)


@functools.lru_cache(maxsize=1)
def _trust_config() -> str:
    """The global config git sees: the user's safe.directory entries alone (else nothing).

    A file, not ``-c``: git drops command-line config when it starts upload-pack in another
    repository (a local clone), which checks the owner of that one too.
    """
    trusted = trusted_directories()
    if not trusted:
        return os.devnull
    fd, path = tempfile.mkstemp(prefix="gtp-carry-trust-", suffix=".gitconfig")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("[safe]\n" + "".join('\tdirectory = "{}"\n'.format(d.replace("\\", "\\\\").replace('"', '\\"'))
                                     for d in trusted))
    atexit.register(os.unlink, path)
    return path


class Git:
    """git verbs on one repository (``git -C path`` with pinned config)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def __call__(self, *args: str, check: bool = True, input: str | bytes | None = None,
                 env: Mapping[str, str] | None = None, binary: bool = False,
                 timeout: float | None = None) -> Result:
        argv = ["git", "-C", str(self.path)]
        for item in _GIT_CONFIG:
            argv += ["-c", item]
        res = run([*argv, *args], env=git_env(env), input=input, check=False, binary=binary,
                  timeout=timeout)
        return self._answered(res, check, binary)

    def _answered(self, res: Result, check: bool, binary: bool) -> Result:
        if not res.ok:
            # A full disk is no answer of git's for a caller to read (a conflict, a missing
            # commit): it stops the command, named as what it is, with or without check.
            full = full_disk_in_output(("" if binary else res.stdout) + res.stderr, self.path)
            if full is not None:
                raise full
            if check:
                raise CommandError(res.argv, res.returncode, "" if binary else res.stdout, res.stderr)
        return res

    def as_user(self, *args: str, check: bool = True, binary: bool = False) -> Result:
        """git as the user's own git runs here: the user's and the repository's config, none of the
        tool's own (what `git add` would make of a file, its end-of-line conversion and filters
        included); only the variables that would point git at another repository are dropped, and its messages are
        English (LC_ALL=C), as the tool reads them (a full disk)."""
        env = {**{k: v for k, v in os.environ.items() if k not in _ELSEWHERE}, "LC_ALL": "C"}
        return self._answered(run(["git", "-C", str(self.path), *args], env=env, check=False, binary=binary),
                              check, binary)

    # -- making repositories -------------------------------------------------
    def init(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self("init", "-q")

    def init_bare(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self("init", "-q", "--bare")

    @classmethod
    def clone(cls, source: Path | str, dest: Path, *, bare: bool = False, branch: str | None = None,
              local: bool = True) -> "Git":
        """Clone ``source`` into ``dest``; ``local`` shares (hardlinks) the objects when it can.

        git 2.39 treats a hard link that fails in an explicit ``--local`` clone as fatal
        (another file system or mount, or protected hard links); then the objects are copied.
        """
        dest.parent.mkdir(parents=True, exist_ok=True)
        args = ["clone", "-q", "--local" if local else "--no-local"]
        if bare:
            args.append("--bare")
        if branch:
            args += ["--branch", branch]
        parent = cls(dest.parent)
        if not local:
            parent(*args, str(source), str(dest))
            return cls(dest)
        first = parent(*args, str(source), str(dest), check=False)
        if not first.ok:
            if dest.exists():
                shutil.rmtree(dest)  # what the failed clone left (git clone refuses a non-empty folder)
            parent(*args, "--no-hardlinks", str(source), str(dest))
        return cls(dest)

    # -- reading -------------------------------------------------------------
    def rev_parse(self, rev: str) -> str | None:
        res = self("rev-parse", "--verify", "-q", f"{rev}^{{commit}}", check=False)
        return res.stdout.strip() or None

    def head(self) -> str | None:
        return self.rev_parse("HEAD")

    def has_commit(self, rev: str) -> bool:
        return self("cat-file", "-e", f"{rev}^{{commit}}", check=False).ok

    def status_paths(self) -> list[str]:
        """Each path the user's own ``git status`` shows (untracked files one by one; a rename's new name, then its
        old), as its bytes: -z, never a line git quoted (a name with a quote, a backslash, a newline). Read with the
        user's config (as_user): a file is an edit as their git converts it (core.autocrlf, filters), never a clean
        checkout of CRLF files read byte for byte against LF blobs, which no stash the hint names would put aside."""
        # --ignore-submodules=none: a repository's config (diff.ignoreSubmodules, submodule.<name>.ignore)
        # must not hide a submodule's edits from the checks that decide a tree holds nothing of the user's
        out = self.as_user("status", "--porcelain", "-z", "--untracked-files=all", "--ignore-submodules=none",
                           binary=True)
        fields = os.fsdecode(out.stdout).split("\0")
        paths: list[str] = []
        while fields:
            entry = fields.pop(0)
            if len(entry) < 4:
                continue
            paths.append(entry[3:])
            if entry[0] in "RC" and fields:
                paths.append(fields.pop(0))  # the old name: its own field, with no status
        return paths

    def rev_list(self, spec: str) -> list[str]:
        return self("rev-list", "--reverse", spec).stdout.split()

    def untrusted(self) -> bool:
        """git refuses this repository: owned by another user, and not in the user's safe.directory."""
        res = self("rev-parse", "--git-dir", check=False)
        return not res.ok and "dubious ownership" in res.stderr

    def is_repo(self) -> bool:
        return (self.path / ".git").exists() and self("rev-parse", "--git-dir", check=False).ok

    def git_dir(self) -> Path:
        return Path(self("rev-parse", "--absolute-git-dir").stdout.strip())

    def archive(self, commit: str, paths: Sequence[str] = ()) -> bytes:
        """The tree of ``commit`` (restricted to ``paths``) as a tar stream."""
        return self("archive", "--format=tar", commit, "--", *paths, binary=True).stdout

    def show_blob(self, rev: str, path: str) -> bytes:
        return self("show", f"{rev}:{path}", binary=True).stdout

    def patch_ids(self, diff: bytes) -> list[tuple[str, str]]:
        """``git patch-id --stable`` over a patch or a ``git log -p`` stream: (patch-id, commit) pairs."""
        out = self("patch-id", "--stable", input=diff, binary=True, check=False).stdout.decode()
        return [(a, b) for a, b in (line.split() for line in out.splitlines() if line.strip())]

    def log_patches(self, spec: str) -> bytes:
        """``git log -p`` of a range in the form ``git patch-id`` reads (one "commit <id>" per commit)."""
        return self("log", "-p", "--no-color", "--format=commit %H", spec, binary=True, check=False).stdout

    # -- writing -------------------------------------------------------------
    def commit_all(self, message: str) -> str:
        self("add", "-A", ".")
        self("commit", "-q", "--allow-empty", "--no-verify", "-m", message)
        return self.head() or ""
