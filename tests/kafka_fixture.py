"""A real Kafka broker for the tests: ``BATON_KAFKA_BOOTSTRAP``, or one started with ``.ci/kafka``.

The ``kafka_bootstrap`` fixture gives ``HOST:PORT`` of a Kafka broker for the whole session:

* ``BATON_KAFKA_BOOTSTRAP=HOST:PORT`` uses that broker (CI starts one before the tests);
* otherwise it runs ``.ci/kafka fetch`` and ``.ci/kafka start`` (java 17+ and mvn needed) and
  stops that Kafka when the session ends;
* if it cannot, tests that need Kafka are skipped with the reason, or fail when ``CI=true``
  (CI must never pass by skipping them).

The ``kafka_sasl`` fixture gives the same Kafka's SASL_SSL listener (:class:`SaslKafka`): from
``BATON_KAFKA_SASL_BOOTSTRAP``, ``BATON_KAFKA_SASL_CA``, ``BATON_KAFKA_SASL_USER`` and
``BATON_KAFKA_SASL_PASSWORD_FILE`` (``.ci/kafka start`` writes them to ``DIR/kafka.env``, which
``.ci/run`` exports), or from the ``kafka.env`` of the Kafka the session started. A Kafka given
by ``BATON_KAFKA_BOOTSTRAP`` alone has no known SASL listener: its tests are skipped, saying so
(failed when ``CI=true``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
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
        # The python that makes the SASL_SSL listener's CA: ours has `cryptography`.
        env={"BATON_KAFKA_PYTHON": sys.executable, **os.environ, **(env or {})},
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


@dataclass(frozen=True)
class SaslKafka:
    """A Kafka listener that speaks SASL_SSL (``.ci/kafka``'s second listener).

    Attributes:
        bootstrap: its ``HOST:PORT``.
        ca: the PEM file of the CA that signed its certificate.
        user: a user that may log in with SCRAM-SHA-512 and with PLAIN.
        password_file: the file whose first line is that user's password.
    """

    bootstrap: str
    ca: str
    user: str
    password_file: str

    def url(self, topic: str, mechanism: str = "SCRAM-SHA-512", *, bootstrap: str | None = None) -> str:
        """A log URL of ``topic`` that logs in with ``mechanism`` (no password: never in a URL)."""
        return (
            f"kafka://{bootstrap or self.bootstrap}/{topic}?security_protocol=SASL_SSL"
            f"&ssl_cafile={self.ca}&sasl_mechanism={mechanism}&sasl_username={self.user}"
        )

    @property
    def password(self) -> str:
        return Path(self.password_file).read_text().splitlines()[0]


_SASL_VARS = ("BATON_KAFKA_SASL_BOOTSTRAP", "BATON_KAFKA_SASL_CA", "BATON_KAFKA_SASL_USER",
              "BATON_KAFKA_SASL_PASSWORD_FILE")


def sasl_from(env: dict[str, str], where: str) -> SaslKafka:
    """The SASL_SSL listener named by ``env`` (its ``BATON_KAFKA_SASL_*`` variables).

    Skips (fails under CI=true) if any is missing; ``where`` says where they were looked for.
    """
    missing = [name for name in _SASL_VARS if not env.get(name, "").strip()]
    if missing:
        unavailable(f"no SASL_SSL Kafka listener: {', '.join(missing)} not set {where}")
    return SaslKafka(*(env[name].strip() for name in _SASL_VARS))


def read_env_file(path: Path) -> dict[str, str]:
    """The ``NAME=VALUE`` lines of ``.ci/kafka``'s ``kafka.env``."""
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.fixture(scope="session")
def kafka_session_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    """The directory of the Kafka this session started, or None when ``BATON_KAFKA_BOOTSTRAP``
    names one."""
    if os.environ.get("BATON_KAFKA_BOOTSTRAP", "").strip():
        yield None
        return
    where = tmp_path_factory.mktemp("kafka")
    start_kafka(where)
    try:
        yield where
    finally:
        stop_kafka(where)


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_session_dir: Path | None) -> str:
    """``HOST:PORT`` of a Kafka broker for this test session (see the module docstring)."""
    if kafka_session_dir is None:
        return os.environ["BATON_KAFKA_BOOTSTRAP"].strip()
    return read_env_file(kafka_session_dir / "kafka.env")["BATON_KAFKA_BOOTSTRAP"]


@pytest.fixture(scope="session")
def kafka_sasl(kafka_session_dir: Path | None) -> SaslKafka:
    """The SASL_SSL listener of the session's Kafka (see the module docstring)."""
    if os.environ.get("BATON_KAFKA_SASL_BOOTSTRAP", "").strip() or kafka_session_dir is None:
        return sasl_from(dict(os.environ), "in the environment (.ci/run exports them from .ci/kafka's kafka.env)")
    return sasl_from(read_env_file(kafka_session_dir / "kafka.env"), f"in {kafka_session_dir / 'kafka.env'}")
