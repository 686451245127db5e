"""Finding another build of Baton for rolling-upgrade runs (loadtest/builds.py): a venv
dir, a ``baton`` executable, a commit's cached venv, and the one-line errors of each way
it can fail. Commits come from small git repositories made in the test's tmp dir."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

from batonmq.cluster.errors import BatonError, InvalidArgument
from batonmq.loadtest.builds import DONE_FILE, BuildError, NoHistory, build_commit, resolve_build

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def fake_baton(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)
    return path


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=repo, capture_output=True, text=True, check=True,
    )
    return done.stdout.strip()


def make_repo(path: Path, files: dict[str, str], commits: int = 1) -> list[str]:
    """A repository with ``commits`` commits of ``files``; their hashes, oldest first."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    hashes = []
    for i in range(commits):
        for name, text in files.items():
            (path / name).write_text(text + f"\n# {i}\n")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"commit {i}")
        hashes.append(git(path, "rev-parse", "HEAD"))
    return hashes


def test_a_venv_dir_resolves_to_its_bin_baton(tmp_path: Path) -> None:
    baton = fake_baton(tmp_path / "venv" / "bin" / "baton")
    assert resolve_build(str(tmp_path / "venv")) == baton


def test_a_baton_executable_resolves_to_itself(tmp_path: Path) -> None:
    baton = fake_baton(tmp_path / "somewhere" / "baton")
    assert resolve_build(str(baton)) == baton


def test_a_dir_without_bin_baton_and_a_file_that_cannot_run_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match="without an executable bin/baton"):
        resolve_build(str(tmp_path / "empty"))
    plain = fake_baton(tmp_path / "plain", mode=0o644)
    with pytest.raises(InvalidArgument, match="is not an executable"):
        resolve_build(str(plain))


@needs_git
def test_a_missing_path_is_refused_as_a_path_not_as_a_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_repo(repo, {"a.txt": "a"})
    with pytest.raises(InvalidArgument, match="no such venv dir or baton executable"):
        resolve_build(str(tmp_path / "no" / "venv"), repo=repo, cache=tmp_path / "cache")


@needs_git
def test_a_commit_not_in_the_history_is_a_one_line_error(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    make_repo(repo, {"a.txt": "a"})
    with pytest.raises(NoHistory, match=r"commit 0123abc is not in the history of") as err:
        resolve_build("0123abc", repo=repo, cache=tmp_path / "cache")
    assert "\n" not in err.value.message
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("venv-*"))


@needs_git
def test_a_shallow_clone_says_that_it_is_shallow(tmp_path: Path) -> None:
    first, _second = make_repo(tmp_path / "origin", {"a.txt": "a"}, commits=2)
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{tmp_path / 'origin'}",
                    str(shallow)], check=True, capture_output=True)
    with pytest.raises(NoHistory, match="shallow.*git fetch --unshallow"):
        build_commit(first[:10], repo=shallow, cache=tmp_path / "cache")


def test_without_git_a_commit_cannot_be_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty-path").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    with pytest.raises(NoHistory, match="needs git, which is not installed"):
        resolve_build("8c400b8", cache=tmp_path / "cache")


@needs_git
def test_a_finished_build_is_reused_as_it_is(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (sha,) = make_repo(repo, {"a.txt": "a"})
    cache = tmp_path / "cache"
    baton = fake_baton(cache / f"venv-{sha}" / "bin" / "baton")
    (baton.parent.parent / DONE_FILE).write_text(sha + "\n")
    # A short name of the commit finds the build of its full hash, untouched.
    assert build_commit(sha[:8], repo=repo, cache=cache) == baton
    assert baton.read_text() == "#!/bin/sh\nexit 0\n"
    assert not (cache / f"src-{sha}").exists()


@needs_git
def test_a_half_made_build_is_made_again_and_a_failed_pip_install_quotes_pip(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    # pip stops at the project's unreadable pyproject.toml, before any download.
    (sha,) = make_repo(repo, {"pyproject.toml": "[project\nname = 'x'"})
    cache = tmp_path / "cache"
    leftover = fake_baton(cache / f"venv-{sha}" / "bin" / "baton")  # no done file
    with pytest.raises(BuildError) as err:
        build_commit(sha, repo=repo, cache=cache)
    message = err.value.message
    assert message.startswith(f"pip install of Baton {sha[:12]} failed"), message
    assert "Expected ']'" in message  # pip's own last line
    # Nothing is left that could pass for a build, and no worktree stays registered.
    assert not leftover.exists() and not (cache / f"venv-{sha}").exists()
    assert not (cache / f"src-{sha}").exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


@needs_git
def test_a_commit_another_process_is_building_waits_for_its_lock(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (sha,) = make_repo(repo, {"a.txt": "a"})
    cache = tmp_path / "cache"
    cache.mkdir()
    with open(cache / f"lock-{sha}", "a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(BuildError, match="another process has been building"):
            build_commit(sha, repo=repo, cache=cache, lock_timeout=0.3)
    assert not (cache / f"venv-{sha}").exists()


def test_the_harness_says_a_bad_old_build_in_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from batonmq.loadtest.__main__ import main

    status = main(["--old-build", str(tmp_path / "no" / "venv"), "--duration", "1", "--quiet"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("loadtest: --old-build: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert issubclass(BuildError, BatonError)
