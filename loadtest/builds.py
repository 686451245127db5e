"""Other builds of Baton, for rolling-upgrade runs: a venv of an earlier commit.

A rolling upgrade starts a cluster on the *previous* build and restarts each broker in
turn on the *new* one (the running code) on the same data dir. The previous build is
named by :func:`resolve_build`, in one of three forms:

- a venv directory with Baton installed: its ``bin/baton`` is run;
- a path to a ``baton`` executable;
- a commit of the repository this module was imported from (a hash, a tag, any
  revision git resolves): :func:`build_commit` makes a venv of it once and caches it.

A commit's build: ``git worktree add --detach <cache>/src-<sha> <sha>`` in this
module's repository, ``python -m venv <cache>/venv-<sha>`` with the Python that runs
this module, and ``<venv>/bin/pip install <worktree>``: a regular (not editable)
install, so the venv holds the whole build and the worktree is removed once it is
done (it would otherwise stay registered in the repository's worktree list). The cache
is ``${XDG_CACHE_HOME:-~/.cache}/baton/builds/``; ``<sha>`` is the full commit hash,
so every name of one commit shares one build. A build is finished when the file
``<venv>/.baton-build-done`` exists: it is written last, so a build that was cut
short (killed, a full disk) is made again from scratch. A lock file per commit
(``lock-<sha>``, ``fcntl.flock``) keeps two processes from building one commit at
once: the second waits, then finds the build done.

Errors are :class:`BuildError` (a failed pip install, with pip's last lines), its
subclass :class:`NoHistory` (git missing, not a git checkout, a commit not in the
history, e.g. of a shallow clone: nothing to build from) or
:class:`~batonmq.cluster.errors.InvalidArgument` (a path that is no venv or executable):
one line for a command line, no traceback.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from batonmq.cluster.errors import BatonError, InvalidArgument

__all__ = [
    "BuildError",
    "DONE_FILE",
    "NoHistory",
    "build_commit",
    "cache_root",
    "repo_root",
    "resolve_build",
]

#: The file that marks a commit's venv finished (written last).
DONE_FILE = ".baton-build-done"

#: Seconds a ``pip install`` of a build may take (dependencies come from the package
#: index, or pip's cache).
PIP_TIMEOUT = 900.0

#: Seconds to wait for another process that builds the same commit.
LOCK_TIMEOUT = PIP_TIMEOUT + 120.0

#: Lines of pip's output a failed install's error quotes.
PIP_TAIL_LINES = 15


class BuildError(BatonError):
    """Another build of Baton could not be found or made (the message says why)."""


class NoHistory(BuildError):
    """There is no history to build a commit from: git is missing, the code is not in a
    git checkout, or the checkout does not have the commit (a shallow clone)."""


class _NoSuchCommit(NoHistory):
    """The revision names no commit of the repository's history."""


def cache_root() -> Path:
    """Where commits' builds are kept: ``${XDG_CACHE_HOME:-~/.cache}/baton/builds``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "baton" / "builds"


def _git(args: list[str], cwd: Path, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run git; BuildError if it is not installed or does not finish in ``timeout`` s."""
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise NoHistory(
            "building Baton from a commit needs git, which is not installed (or not on PATH);"
            " give a venv dir or a baton executable instead"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"git {' '.join(args)} took over {timeout:g}s") from exc


def _last_lines(text: str, n: int) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-n:])


def repo_root(start: Path | None = None) -> Path:
    """The top of the git checkout holding ``start`` (default: this module's folder).

    Raises:
        NoHistory: git is missing, or ``start`` is not inside a git checkout (Baton
            installed from a wheel: give a venv or an executable instead of a commit).
    """
    where = start if start is not None else Path(__file__).resolve().parent
    done = _git(["rev-parse", "--show-toplevel"], cwd=where)
    if done.returncode != 0:
        raise NoHistory(
            f"{where} is not in a git checkout ({_last_lines(done.stderr, 1)}), so it cannot"
            " build another commit of Baton; give a venv dir or a baton executable instead"
        )
    return Path(done.stdout.strip())


def _full_commit(commit: str, repo: Path) -> str:
    """The full hash of ``commit`` in ``repo``.

    Raises:
        NoHistory: it names no commit of the repository's history (saying so when the
            clone is shallow).
    """
    if not commit or commit.startswith("-"):
        raise InvalidArgument(f"{commit!r} is not a commit")
    done = _git(["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=repo)
    if done.returncode == 0 and done.stdout.strip():
        return done.stdout.strip()
    shallow = _git(["rev-parse", "--is-shallow-repository"], cwd=repo)
    hint = (
        ": this clone is shallow (git fetch --unshallow brings the history)"
        if shallow.stdout.strip() == "true" else ""
    )
    raise _NoSuchCommit(f"commit {commit} is not in the history of {repo}{hint}")


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def resolve_build(
    spec: str,
    *,
    repo: Path | None = None,
    cache: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The ``baton`` executable of the build ``spec`` names (see the module doc).

    Args:
        spec: a venv dir, a path to a ``baton`` executable, or a commit.
        repo: the repository of commits (default: :func:`repo_root`).
        cache: where commits' builds go (default: :func:`cache_root`).
        progress: called with a line before a commit is built (it takes minutes).

    Returns:
        The absolute path of that build's ``baton`` executable.

    Raises:
        InvalidArgument: ``spec`` is a directory without ``bin/baton``, or a file that
            is not executable.
        BuildError: ``spec`` is no path, and no commit could be built from it
            (:class:`NoHistory`: there is no such commit here to build).
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        baton = path / "bin" / "baton"
        if not _executable(baton):
            raise InvalidArgument(
                f"{spec} is a directory without an executable bin/baton: not a venv with Baton"
                " installed"
            )
        return baton.absolute()
    if path.exists():
        if not _executable(path):
            raise InvalidArgument(f"{spec} is not an executable (a baton command)")
        return path.absolute()
    try:
        return build_commit(spec, repo=repo, cache=cache, progress=progress)
    except _NoSuchCommit as exc:
        if os.sep in spec or spec.startswith((".", "~")):
            # Meant as a path, most likely.
            raise InvalidArgument(
                f"{spec}: no such venv dir or baton executable (nor a commit: {exc.message})"
            ) from exc
        raise


def build_commit(
    commit: str,
    *,
    repo: Path | None = None,
    cache: Path | None = None,
    progress: Callable[[str], None] | None = None,
    pip_timeout: float = PIP_TIMEOUT,
    lock_timeout: float = LOCK_TIMEOUT,
) -> Path:
    """Make (once) and cache a venv of Baton at ``commit``; its ``baton`` executable.

    Args:
        commit: any revision of ``repo`` naming a commit.
        repo: the repository (default: the checkout this module was imported from).
        cache: the cache dir (default: :func:`cache_root`).
        progress: called with a line when the build starts (it takes minutes).
        pip_timeout: seconds the ``pip install`` may take.
        lock_timeout: seconds to wait while another process builds the same commit.

    Returns:
        ``<cache>/venv-<sha>/bin/baton``.

    Raises:
        NoHistory: git is missing, ``repo`` is no checkout, or ``commit`` is not in its
            history.
        BuildError: another process held the build's lock over ``lock_timeout``, or a
            step failed (pip's last lines are in the message).
    """
    root = repo if repo is not None else repo_root()
    sha = _full_commit(commit, root)
    cache_dir = cache if cache is not None else cache_root()
    venv = cache_dir / f"venv-{sha}"
    baton = venv / "bin" / "baton"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        lock = open(cache_dir / f"lock-{sha}", "a+b")
    except OSError as exc:
        raise BuildError(f"cannot use the build cache {cache_dir}: {exc}") from exc
    with lock:
        deadline = time.monotonic() + lock_timeout
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BuildError(
                        f"another process has been building {sha[:12]} for over"
                        f" {lock_timeout:g}s (lock {lock.name})"
                    ) from None
                time.sleep(0.5)  # polling the lock: its holder is building (minutes)
        # The lock is released when the file is closed, also if this process dies.
        if (venv / DONE_FILE).exists() and _executable(baton):
            return baton
        if progress is not None:
            progress(f"building Baton {sha[:12]} into {venv} (once; this takes a few minutes)")
        try:
            _build(root, sha, cache_dir, venv, pip_timeout)
        except OSError as exc:
            raise BuildError(f"building {sha[:12]} in {cache_dir}: {exc}") from exc
        return baton


def _remove_worktree(root: Path, src: Path) -> None:
    """Remove a worktree of ours (registered or half made), and prune its record."""
    if src.exists():
        _git(["worktree", "remove", "--force", str(src)], cwd=root)
        shutil.rmtree(src, ignore_errors=True)
    _git(["worktree", "prune"], cwd=root)


def _build(root: Path, sha: str, cache_dir: Path, venv: Path, pip_timeout: float) -> None:
    """The build itself, under the commit's lock: anything left of an earlier attempt
    is removed first (it has no done file)."""
    src = cache_dir / f"src-{sha}"
    shutil.rmtree(venv, ignore_errors=True)
    _remove_worktree(root, src)
    try:
        done = _git(["worktree", "add", "--detach", str(src), sha], cwd=root)
        if done.returncode != 0:
            raise BuildError(
                f"git worktree add of {sha[:12]} failed: {_last_lines(done.stderr, 5)}"
            )
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True,
            timeout=300, stdin=subprocess.DEVNULL,
        )
        if made.returncode != 0:
            raise BuildError(
                f"python -m venv {venv} failed: {_last_lines(made.stdout + made.stderr, 5)}"
            )
        try:
            pip = subprocess.run(
                [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                 str(src)],
                capture_output=True, text=True, timeout=pip_timeout, stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise BuildError(
                f"pip install of Baton {sha[:12]} took over {pip_timeout:g}s"
            ) from exc
        if pip.returncode != 0:
            raise BuildError(
                f"pip install of Baton {sha[:12]} failed (exit {pip.returncode}):\n"
                + _last_lines(pip.stdout + "\n" + pip.stderr, PIP_TAIL_LINES)
            )
        if not _executable(venv / "bin" / "baton"):
            raise BuildError(f"the build of {sha[:12]} has no bin/baton: is it Baton?")
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(venv, ignore_errors=True)
        raise BuildError(f"building {sha[:12]}: {exc}") from exc
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)  # half made: no done file, so redone anyway
        raise
    finally:
        # The venv holds the whole build (not an editable install): the source goes.
        _remove_worktree(root, src)
    tmp = venv / (DONE_FILE + ".tmp")
    tmp.write_text(sha + "\n")
    tmp.replace(venv / DONE_FILE)  # last: only now is the build finished
