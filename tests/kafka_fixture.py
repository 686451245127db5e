"""A real Kafka broker for the tests: ``BATON_KAFKA_BOOTSTRAP``, or one started with ``.ci/kafka``.

The ``kafka_bootstrap`` fixture gives ``HOST:PORT`` of a Kafka broker for the whole session:

* ``BATON_KAFKA_BOOTSTRAP=HOST:PORT`` uses that broker (CI starts one before the tests);
* otherwise it runs ``.ci/kafka fetch`` and ``.ci/kafka start`` (java 17+ and mvn needed) and
  stops that Kafka when the session ends;
* if it cannot, tests that need Kafka are skipped with the reason, or fail when ``CI=true``
  (CI must never pass by skipping them).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / ".ci" / "kafka"

# Bounded so that, with a warm jar cache, starting stays well inside the first test's
# pytest-timeout (the session fixture's set-up counts toward it). A cold fetch takes seconds
# with a good network; if it takes longer, run `.ci/kafka fetch` once by hand.
FETCH_TIMEOUT = 45.0
START_TIMEOUT = 60  # the script's own readiness wait; it stops Kafka when it gives up


def unavailable(reason: str) -> NoReturn:
    """Skip (fail under CI=true) the test that needs Kafka, saying why."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: Kafka tests may not be skipped)", pytrace=False)
    pytest.skip(reason)


def run_script(*args: str, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run ``.ci/kafka ARGS``; returns its stdout. Raises RuntimeError with its stderr on failure."""
    proc = subprocess.Popen(
        [str(SCRIPT), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # so a timeout can stop it and its children (mvn) together
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise RuntimeError(f"'.ci/kafka {' '.join(args)}' took over {timeout:g}s:\n{err[-3000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"'.ci/kafka {' '.join(args)}' failed (exit {proc.returncode}):\n{err[-3000:]}")
    return out


def missing_tools() -> list[str]:
    java_home = os.environ.get("JAVA_HOME", "")
    has_java = shutil.which("java") is not None or (bool(java_home) and Path(java_home, "bin", "java").exists())
    return [name for name, ok in (("java", has_java), ("mvn", shutil.which("mvn") is not None)) if not ok]


def start_kafka(where: Path) -> str:
    """Fetch the jars if needed and start a Kafka with its data in ``where``; returns HOST:PORT.

    Skips (fails under CI=true) if that is not possible here. Stop it with :func:`stop_kafka`.
    """
    missing = missing_tools()
    if missing:
        unavailable(
            f"no Kafka: {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} needed to "
            "start one; or set BATON_KAFKA_BOOTSTRAP=HOST:PORT"
        )
    try:
        run_script("fetch", timeout=FETCH_TIMEOUT)
        out = run_script(
            "start", str(where), timeout=START_TIMEOUT + 30,
            env={"BATON_KAFKA_START_TIMEOUT": str(START_TIMEOUT)},
        )
    except RuntimeError as exc:
        stop_kafka(where)
        unavailable(f"no Kafka: {exc}")
    lines = out.strip().splitlines()
    if not lines:
        stop_kafka(where)
        unavailable("no Kafka: '.ci/kafka start' printed no bootstrap address")
    return lines[-1]


def stop_kafka(where: Path) -> None:
    """Stop the Kafka started in ``where`` (nothing if none runs there)."""
    try:
        run_script("stop", str(where), timeout=60)
    except RuntimeError as exc:
        print(f"stopping the test Kafka in {where} failed: {exc}")


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``HOST:PORT`` of a Kafka broker for this test session (see the module docstring)."""
    given = os.environ.get("BATON_KAFKA_BOOTSTRAP", "").strip()
    if given:
        yield given
        return
    where = tmp_path_factory.mktemp("kafka")
    bootstrap = start_kafka(where)
    try:
        yield bootstrap
    finally:
        stop_kafka(where)
