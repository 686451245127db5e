"""aio-pika's own tests against three real ``baton serve`` brokers, checked against
``loadtest/amqp_suites_expected.toml`` (docs/amqp.md "Client test suites"): a subset
that fits CI's time, run by the same runner as the full suites. It fails on any failure
that is not listed with its cause.

The subset (under a minute on two cores with the brokers' start, more beside other
runs; a fresh machine also installs the suite's venv from PyPI): ``tests/test_amqp.py``,
aio-pika's tests of the AMQP model (publish, confirms, consume, get, ack, reject, nack,
exchanges, bindings, dead letters, message TTL, transactions, 22 MB messages) with
confirms, on ``connect`` and ``connect_robust`` (the same tests without confirms are
left out), and its small files of connection, message and RPC details. The whole suite
takes about 11 minutes, pika's about as long (and pika 1.4.4's tests are on no package
registry): both run by hand (``python -m batonmq.loadtest.amqp_suites``, docs/amqp.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

#: The part of aio-pika 10.2.1's suite CI runs (files of its tests/).
CI_SUBSET = (
    "tests/test_amqp.py",
    "tests/test_json_rpc.py",
    "tests/test_message.py",
    "tests/test_connection_close_state.py",
    "tests/test_connection_options.py",
    "tests/test_connection_params.py",
    "tests/test_close_notification.py",
    "tests/test_nowait.py",
    "tests/test_consumer_publish_errors.py",
    "tests/test_rpc_factory.py",
)


def test_aio_pikas_own_tests_on_three_brokers_fail_only_as_listed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "batonmq.loadtest.amqp_suites", "--suite", "aio-pika",
         "--brokers", "3", "--out", str(out), "--tests", *CI_SUBSET, "--",
         "-k", "not NoConfirms"],
        capture_output=True, text=True, timeout=840, check=False,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    summary = json.loads((out / "summary.json").read_text())["aio-pika"]
    assert summary["new_failures"] == [], report
    assert summary["passed"] > 150, report  # (it ran: not a collection error)
