"""RabbitMQ's Python clients' own test suites against Baton's AMQP listener, checked.

``python -m batonmq.loadtest.amqp_suites`` fetches a pinned source archive of pika and of
aio-pika (sha256 checked; nothing of theirs is copied into this repository), unpacks it
into a cache dir (``~/.cache/baton/amqp-suites/``), installs the library from it and the
suite's test tools from PyPI into a throw-away venv of its own in that cache dir (the
running venv is not touched), starts Baton brokers (one, or three on one shared file
log, each ``--amqp-listen 127.0.0.1:0``) or a local RabbitMQ node for comparison, points
the suite at them and runs it with a per-test timeout (pytest-timeout), writing a JUnit
XML file and a summary per suite.

The brokers are reached through a small TCP forwarder the runner starts: pika's
acceptance tests connect to ``127.0.0.1:5672`` (they have no setting), aio-pika's to
the address its Docker fixture gets (:mod:`amqp_suites_plugin` answers it). With three
brokers the forwarder hands each new connection to the next broker in turn, so a test's
connections are spread over the cluster.

The outcome is checked against ``amqp_suites_expected.toml``: every failing test listed
there with its cause. The run exits 1 on a failure that is not listed (a new one), and
names the listed tests that pass now (so that the list shrinks). ``--check JUNIT`` checks
a JUnit file of an earlier run without running anything.

The brokers run with a ``max_message`` of 32 MiB (:data:`BATON_ARGS`): the suites send
15 MB and 22 MB bodies, which RabbitMQ 3.x takes by default (up to 128 MiB).
``--tests`` runs part of a suite (CI runs a part of aio-pika's on three brokers,
tests/integration/test_amqp_suites.py); the whole suites take about 11 minutes each and
are run by hand. docs/amqp.md ("Client test suites") has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = [
    "SUITES", "Suite", "Expected", "Cause", "Outcome", "Verdict",
    "load_expected", "parse_junit", "compare", "format_verdict", "main",
]

#: The expected failures, next to this module.
EXPECTED_FILE = Path(__file__).with_name("amqp_suites_expected.toml")


@dataclasses.dataclass(frozen=True, slots=True)
class Suite:
    """A client library's test suite, pinned.

    Attributes:
        name: ``pika`` or ``aio-pika``.
        version: the library's version (installed from the same archive).
        url: where the source archive is fetched.
        sha256: of the archive, as fetched (``tar_sha256`` for pika's, see below).
        tar_sha256: for a GitHub archive, the sha256 of the uncompressed tar (``git
            archive`` of the tag's commit), which does not depend on how it was gzipped.
        top: the archive's top folder.
        paths: what pytest runs, inside it.
        deps: the suite's test tools from PyPI, pinned.
        args: more pytest options the suite needs.
    """

    name: str
    version: str
    url: str
    sha256: str
    tar_sha256: str
    top: str
    paths: tuple[str, ...]
    deps: tuple[str, ...]
    args: tuple[str, ...] = ()


SUITES: dict[str, Suite] = {
    # pika's PyPI sdist holds no tests: the GitHub archive of the tag (commit 60fee420).
    "pika": Suite(
        name="pika",
        version="1.4.4",
        url="https://github.com/pika/pika/archive/refs/tags/1.4.4.tar.gz",
        sha256="",
        tar_sha256="69fa0f488148fc78c14d97a50f4161c8c9c0f6453ad0201e537d91b17a6c9c76",
        top="pika-1.4.4",
        paths=("tests/acceptance",),
        deps=("pytest==9.2.0", "pytest-timeout==2.4.0", "tornado==6.6.1", "twisted==26.10.0",
              "gevent==26.9.0"),
    ),
    "aio-pika": Suite(
        name="aio-pika",
        version="10.2.1",
        url=("https://files.pythonhosted.org/packages/5d/31/70f0d7a9fe1affc3241d86d24c24714a"
             "4a2ac648961efd3d835ef734a6a1/aio_pika-10.2.1.tar.gz"),
        sha256="e4f77afd9179a3cca5a904c3b0a1190256a36d9f90650db908b1b2245eb27487",
        tar_sha256="",
        top="aio_pika-10.2.1",
        paths=("tests",),
        deps=("pytest==9.2.0", "pytest-timeout==2.4.0", "aiomisc==18.0.37",
              "aiomisc-pytest==2.0.0", "shortuuid==1.0.13", "timeout-decorator==0.5.0",
              "pytest-rst==0.2.3"),
        # Its own pytest settings turn pytest-asyncio off and log every test's lines.
        args=("-p", "no:asyncio", "-o", "log_cli=false"),
    ),
}


# --- the expected failures ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Cause:
    """One reason some tests fail (or are skipped), with the tests it explains.

    Attributes:
        key: short name (``x-expires``).
        reason: one line: what Baton does or lacks.
        fix: what Baton would need (an edge fix, a replicated format change...).
        modes: the runs it applies to (``1``, ``3``: broker counts; ``rabbitmq``); empty:
            every run.
        skip: skip these tests (they need the internet, Docker...) instead of running them.
        tests: test ids, ``suite:classname::name`` (see :func:`parse_junit`).
        rabbitmq: how these tests fare against RabbitMQ ("" unknown).
    """

    key: str
    reason: str
    fix: str
    modes: tuple[str, ...]
    skip: bool
    tests: tuple[str, ...]
    rabbitmq: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Expected:
    """The expected-failures file: its causes, in order."""

    causes: tuple[Cause, ...]

    def for_mode(self, mode: str) -> dict[str, Cause]:
        """Test id -> its cause, for one run's mode (``1``, ``3``, ``rabbitmq``)."""
        out: dict[str, Cause] = {}
        for c in self.causes:
            if c.modes and mode not in c.modes:
                continue
            for t in c.tests:
                out.setdefault(t, c)
        return out


class ExpectedFileError(ValueError):
    """The expected-failures file is malformed (the message says where)."""


def load_expected(text: str) -> Expected:
    """Parse the expected-failures TOML: ``[[cause]]`` tables with ``key``, ``reason``,
    ``fix``, optional ``modes``, ``skip`` and ``rabbitmq``, and ``tests``.

    Raises:
        ExpectedFileError: not TOML, a missing or mistyped field, a test id without its
            suite, or a test listed twice for the same mode.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExpectedFileError(f"not TOML: {exc}") from exc
    causes: list[Cause] = []
    seen: dict[str, list[tuple[tuple[str, ...], str]]] = {}
    for i, raw in enumerate(doc.get("cause", [])):
        where = f"cause #{i + 1} ({raw.get('key', '?')})"
        for name in ("key", "reason", "tests"):
            if name not in raw:
                raise ExpectedFileError(f"{where}: no {name!r}")
        tests = raw["tests"]
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise ExpectedFileError(f"{where}: 'tests' must be a list of test ids")
        modes = tuple(str(m) for m in raw.get("modes", []))
        for t in tests:
            suite, sep, rest = t.partition(":")
            if not sep or suite not in SUITES or "::" not in rest:
                raise ExpectedFileError(
                    f"{where}: {t!r} is not 'SUITE:classname::name' (suites: {', '.join(SUITES)})")
            for other_modes, other_key in seen.get(t, []):
                # Two causes for one test in one run: empty modes means every run.
                if not modes or not other_modes or set(modes) & set(other_modes):
                    raise ExpectedFileError(f"{where}: {t!r} is listed under {other_key!r} too")
            seen.setdefault(t, []).append((modes, str(raw["key"])))
        causes.append(Cause(
            key=str(raw["key"]), reason=str(raw["reason"]), fix=str(raw.get("fix", "")),
            modes=modes, skip=bool(raw.get("skip", False)), tests=tuple(tests),
            rabbitmq=str(raw.get("rabbitmq", "")),
        ))
    return Expected(tuple(causes))


# --- a run's outcome ------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Outcome:
    """What a JUnit XML file says: each test's status and the run's counts.

    Attributes:
        status: test id -> ``passed``, ``failed``, ``error`` or ``skipped``.
        messages: test id -> the first line of its failure, error or skip message.
        duration: the run's time in seconds (the ``testsuite``'s ``time``).
    """

    status: dict[str, str]
    messages: dict[str, str]
    duration: float

    def counts(self) -> dict[str, int]:
        c = Counter(self.status.values())
        return {k: c.get(k, 0) for k in ("passed", "failed", "error", "skipped")}


_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def parse_junit(xml_text: str, suite: str) -> Outcome:
    """Read pytest's JUnit XML. A test's id is ``suite:classname::name``; a test reported
    twice (a failure, then an error in its teardown) keeps its worst status.

    Raises:
        ValueError: not JUnit XML.
    """
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise ValueError(f"not JUnit XML: {exc}") from exc
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    status: dict[str, str] = {}
    messages: dict[str, str] = {}
    duration = 0.0
    for ts in suites:
        duration += float(ts.get("time", "0") or 0)
        for case in ts.iter("testcase"):
            tid = f"{suite}:{case.get('classname', '')}::{case.get('name', '')}"
            st, msg = "passed", ""
            for tag, name in (("error", "error"), ("failure", "failed"), ("skipped", "skipped")):
                el = case.find(tag)
                if el is not None:
                    first = (el.get("message") or el.text or "").strip().splitlines()[:1]
                    st, msg = name, (first[0][:200] if first else "")
                    break
            if tid not in status or _RANK[st] > _RANK[status[tid]]:
                status[tid] = st
                messages[tid] = str(msg)
    return Outcome(status, messages, duration)


@dataclasses.dataclass(slots=True)
class Verdict:
    """A run compared with the expected failures.

    Attributes:
        new_failures: failed or errored, not listed (the run fails on these).
        now_passing: listed (not as a skip), and passed: take them off the list.
        expected_failures: failed or errored as listed, by cause key.
        not_run: listed for this mode but not in the run (renamed, or deselected).
    """

    new_failures: list[str]
    now_passing: list[str]
    expected_failures: dict[str, list[str]]
    not_run: list[str]

    @property
    def ok(self) -> bool:
        return not self.new_failures


def compare(outcome: Outcome, expected: Expected, mode: str, suites: set[str]) -> Verdict:
    """Compare a run of ``suites`` in ``mode`` with the expected failures."""
    listed = {t: c for t, c in expected.for_mode(mode).items() if t.split(":", 1)[0] in suites}
    new: list[str] = []
    passing: list[str] = []
    by_cause: dict[str, list[str]] = {}
    for tid, st in sorted(outcome.status.items()):
        cause = listed.get(tid)
        if st in ("failed", "error"):
            if cause is None or cause.skip:
                new.append(tid)
            else:
                by_cause.setdefault(cause.key, []).append(tid)
        elif st == "passed" and cause is not None and not cause.skip:
            passing.append(tid)
    not_run = sorted(t for t in listed if t not in outcome.status)
    return Verdict(new, passing, by_cause, not_run)


def format_verdict(outcome: Outcome, verdict: Verdict, expected: Expected, title: str) -> str:
    """The summary a run prints and writes: counts, causes, new failures, now passing."""
    c = outcome.counts()
    lines = [
        f"== {title}: {c['passed']} passed, {c['failed']} failed, {c['error']} errors, "
        f"{c['skipped']} skipped in {outcome.duration:.0f}s",
    ]
    reasons = {x.key: x.reason for x in expected.causes}
    for key, tests in sorted(verdict.expected_failures.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"   expected, {len(tests):4d}  {key}: {reasons.get(key, '')}")
    if verdict.now_passing:
        lines.append(f"   {len(verdict.now_passing)} listed test(s) pass now (take them off"
                     f" {EXPECTED_FILE.name}):")
        lines += [f"     {t}" for t in verdict.now_passing]
    if verdict.new_failures:
        lines.append(f"   {len(verdict.new_failures)} NEW failure(s), not in {EXPECTED_FILE.name}:")
        lines += [f"     {t}  -- {outcome.messages.get(t, '')}" for t in verdict.new_failures]
    lines.append("   OK: no new failure" if verdict.ok else "   FAILED: new failures")
    return "\n".join(lines)


# --- fetching and installing ----------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tar_sha256(path: Path) -> str:
    import gzip
    with gzip.open(path, "rb") as f:
        return _sha256(f.read())


def fetch_source(suite: Suite, cache: Path, archive: Path | None = None) -> Path:
    """The suite's unpacked source in ``cache``, fetched (or taken from ``archive``) and
    checked against its pinned sha256 first.

    Raises:
        RuntimeError: the download failed or the archive's checksum is not the pinned one.
    """
    src = cache / suite.top
    if (src / ".baton-verified").exists():
        return src
    cache.mkdir(parents=True, exist_ok=True)
    tgz = cache / f"{suite.top}.tar.gz"
    if archive is not None:
        tgz.write_bytes(archive.read_bytes())
    elif not tgz.exists():
        try:
            with urllib.request.urlopen(suite.url, timeout=120) as resp:
                tgz.write_bytes(resp.read())
        except OSError as exc:
            raise RuntimeError(
                f"cannot fetch {suite.url}: {exc} (give a copy with --{suite.name}-archive)"
            ) from exc
    got = _tar_sha256(tgz) if suite.tar_sha256 else _sha256(tgz.read_bytes())
    want = suite.tar_sha256 or suite.sha256
    if got != want:
        tgz.unlink()
        raise RuntimeError(f"{suite.name} {suite.version}: sha256 {got}, pinned {want}")
    with tarfile.open(tgz) as tf:
        tf.extractall(cache, filter="data")
    (src / ".baton-verified").write_text(want + "\n")
    return src


def prepare_venv(suite: Suite, src: Path, cache: Path) -> Path:
    """A throw-away venv for the suite (made once): the library from its source, its test
    tools from PyPI. Returns its python."""
    venv = cache / f"venv-{suite.name}-{suite.version}"
    py = venv / "bin" / "python"
    stamp = venv / ".baton-ready"
    want = json.dumps([str(src), *suite.deps])
    if stamp.exists() and stamp.read_text() == want:
        return py
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(src), *suite.deps], check=True)
    stamp.write_text(want)
    return py


# --- the broker under test ------------------------------------------------------------


class Forwarder:
    """A TCP forwarder on 127.0.0.1 that hands each new connection to the next upstream
    in turn (its own event loop, in a thread)."""

    def __init__(self, upstreams: list[str], port: int = 0) -> None:
        self.upstreams = [(a.rpartition(":")[0], int(a.rpartition(":")[2])) for a in upstreams]
        self.port = port
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error: BaseException | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> str:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise RuntimeError(f"cannot listen on 127.0.0.1:{self.port}: {self._error}")
        return self.address

    def stop(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive() and self._error is None:
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self.port))
            self.port = self._server.sockets[0].getsockname()[1]
        except OSError as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.upstreams[self._next % len(self.upstreams)]
        self._next += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


#: ``baton serve`` options for the brokers under test. The suites send bodies of 15 MB
#: (pika) and 22 MB (aio-pika): RabbitMQ 3.x takes up to 128 MiB by default, Baton 8 MiB
#: (``max_message``), so the runner raises Baton's limit (and the frame and body buffers
#: that must hold such a message) rather than list those tests.
BATON_ARGS: tuple[str, ...] = (
    "--max-message", str(32 * 1024 * 1024),
    "--max-frame", str(64 * 1024 * 1024),
    "--amqp-body-buffer", str(64 * 1024 * 1024),
    "--amqp-body-buffer-total", str(128 * 1024 * 1024),
)


def start_target(target: str, brokers: int, base: Path) -> tuple[list[str], Any]:
    """Start the brokers under test: ``baton`` (``brokers`` of them on one file log) or
    ``rabbitmq`` (a local node). Returns their AMQP addresses and the system to stop."""
    if target == "rabbitmq":
        from batonmq.loadtest.peers.rabbitmq import RabbitSystem
        rabbit = RabbitSystem(base / "rabbitmq", nodes=brokers)
        return rabbit.start(), rabbit
    from batonmq.loadtest.cluster import BatonCluster
    cluster = BatonCluster(brokers, base / "baton", amqp=True, extra_args=list(BATON_ARGS))
    return cluster.start(), cluster


# --- running a suite ------------------------------------------------------------------



def run_suite(suite: Suite, py: Path, src: Path, address: str, out: Path, timeout: float,
              skips: dict[str, str], extra: list[str],
              paths: tuple[str, ...] | None = None) -> Path:
    """Run the suite against ``address`` (``paths``: these of its tests instead of all);
    returns its JUnit XML file (its output beside)."""
    junit = out / f"{suite.name}.junit.xml"
    log = out / f"{suite.name}.out"
    prefix = f"{suite.name}:"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        "PYTHONPATH": str(Path(__file__).parent),
        "BATON_SUITE_SKIPS": json.dumps(
            {t[len(prefix):]: r for t, r in skips.items() if t.startswith(prefix)}),
        "BATON_SUITE_DOCKER_AMQP": address if suite.name == "aio-pika" else "",
        "AMQP_URL": f"amqp://guest:guest@{address}/",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    cmd = [
        str(py), "-m", "pytest", *(paths or suite.paths), "-p", "amqp_suites_plugin",
        "-p", "no:cacheprovider",
        f"--junitxml={junit}", "-o", "junit_family=xunit2",
        f"--timeout={timeout:g}", "--timeout-method=signal", "-q", "-rN",
        *suite.args, *extra,
    ]
    with open(log, "wb") as f:
        f.write(f"$ {' '.join(cmd)}\n".encode())
        f.flush()
        subprocess.run(cmd, cwd=src, env=env, stdout=f, stderr=subprocess.STDOUT, check=False)
    return junit


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``). Exit code 0: no new failure; 1: new failures; 2: the
    run could not be made."""
    p = argparse.ArgumentParser(prog="python -m batonmq.loadtest.amqp_suites",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    p.add_argument("--brokers", type=int, choices=(1, 3), default=1)
    p.add_argument("--target", choices=("baton", "rabbitmq"), default="baton")
    p.add_argument("--timeout", type=float, default=30.0, help="per test, seconds (30)")
    p.add_argument("--out", type=Path, default=Path("amqp-suites-out"))
    p.add_argument("--cache", type=Path, default=Path(
        os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "baton" / "amqp-suites")
    p.add_argument("--expected", type=Path, default=EXPECTED_FILE)
    p.add_argument("--pika-archive", type=Path, help="a copy of pika's GitHub archive")
    p.add_argument("--aio-pika-archive", type=Path, help="a copy of aio-pika's sdist")
    p.add_argument("--tests", nargs="+", metavar="PATH",
                   help="run these of the suite's tests (files, or pytest node ids, relative"
                        " to its source) instead of all (a subset, as CI runs)")
    p.add_argument("--check", type=Path, metavar="JUNIT",
                   help="check a JUnit file of an earlier run of --suite; run nothing")
    p.add_argument("pytest_args", nargs="*", help="more pytest options (after --)")
    a = p.parse_args(argv)
    # SIGTERM (a timeout, a stop) ends the run through the finally blocks below, so that
    # the brokers and the suite's pytest are stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        expected = load_expected(a.expected.read_text())
    except (OSError, ExpectedFileError) as exc:
        print(f"amqp_suites: {a.expected}: {exc}", file=sys.stderr)
        return 2
    mode = "rabbitmq" if a.target == "rabbitmq" else str(a.brokers)
    names = list(SUITES) if a.suite == "all" else [a.suite]
    if a.check is not None:
        if len(names) != 1:
            print("amqp_suites: --check needs one --suite", file=sys.stderr)
            return 2
        outcome = parse_junit(a.check.read_text(), names[0])
        verdict = compare(outcome, expected, mode, set(names))
        print(format_verdict(outcome, verdict, expected, f"{names[0]}, {mode}"))
        return 0 if verdict.ok else 1
    if a.tests and len(names) != 1:
        print("amqp_suites: --tests needs one --suite", file=sys.stderr)
        return 2
    skips = {t: c.reason for t, c in expected.for_mode(mode).items() if c.skip}
    a.out.mkdir(parents=True, exist_ok=True)
    ok = True
    summary: dict[str, Any] = {"mode": mode, "target": a.target, "brokers": a.brokers}
    for name in names:
        suite = SUITES[name]
        try:
            archive = a.pika_archive if name == "pika" else a.aio_pika_archive
            src = fetch_source(suite, a.cache, archive)
            py = prepare_venv(suite, src, a.cache)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            print(f"amqp_suites: {name}: {exc}", file=sys.stderr)
            return 2
        base = a.out / f"{name}-{mode}-system"
        shutil.rmtree(base, ignore_errors=True)  # a fresh log: no queue of an earlier run
        addresses, system = start_target(a.target, a.brokers, base)
        # pika's acceptance tests connect to 127.0.0.1:5672 and have no setting for it.
        fwd = Forwarder(addresses, port=5672 if name == "pika" else 0)
        started = time.monotonic()
        try:
            address = fwd.start()
            junit = run_suite(suite, py, src, address, a.out, a.timeout, skips, a.pytest_args,
                              tuple(a.tests) if a.tests else None)
        finally:
            fwd.stop()
            system.stop()
        wall = time.monotonic() - started
        outcome = parse_junit(junit.read_text(), name) if junit.exists() else Outcome({}, {}, 0)
        verdict = compare(outcome, expected, mode, {name})
        title = f"{name} {suite.version}, {a.target}" + (
            f", {a.brokers} broker(s)" if a.target == "baton" else f", {a.brokers} node(s)")
        text = format_verdict(outcome, verdict, expected, title)
        print(text, flush=True)
        ok = ok and verdict.ok and bool(outcome.status)
        summary[name] = {
            **outcome.counts(), "duration_s": round(outcome.duration, 1), "wall_s": round(wall, 1),
            "failing": sorted(t for t, s in outcome.status.items() if s in ("failed", "error")),
            "new_failures": verdict.new_failures, "now_passing": verdict.now_passing,
            "by_cause": {k: len(v) for k, v in verdict.expected_failures.items()},
        }
        (a.out / f"{name}.summary.txt").write_text(text + "\n")
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
