"""A pytest plugin loaded into a client library's own test suite by :mod:`amqp_suites`.

It runs inside the suite's throw-away venv (imported by its top-level name,
``-p amqp_suites_plugin``, from this folder on ``PYTHONPATH``), so it uses the standard
library only and no ``batonmq`` module. It does two things:

* skips the tests the runner names (``BATON_SUITE_SKIPS``: a JSON map of test id to
  reason), e.g. those that need the internet or a Docker image's TLS listener;
* for aio-pika, whose ``tests/conftest.py`` starts RabbitMQ in Docker
  (``mosquito/aiormq-rabbitmq``) and refuses to run without a Docker daemon, answers its
  Docker client with the broker under test (``BATON_SUITE_AMQP``: ``HOST:PORT``) instead
  of a container. The suite's files are not changed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

_SKIPS: dict[str, str] = json.loads(os.environ.get("BATON_SUITE_SKIPS", "{}") or "{}")


def test_id(nodeid: str) -> str:
    """The id of a test as JUnit XML names it: ``classname::name``.

    ``tests/test_amqp.py::TestCase::test_x[connect]`` is
    ``tests.test_amqp.TestCase::test_x[connect]`` (the runner builds the same id from
    a ``<testcase classname=... name=...>``).
    """
    parts = nodeid.split("::")
    path = parts[0][:-3] if parts[0].endswith(".py") else parts[0]
    classname = ".".join([path.replace("/", "."), *parts[1:-1]])
    return f"{classname}::{parts[-1]}"


def _answer_docker(address: str) -> None:
    """Point aio-pika's Docker fixtures at ``address`` (import its client module first, so
    that its conftest imports the patched names)."""
    sys.path.insert(0, os.getcwd())
    try:
        import tests.docker_client as dc  # type: ignore[import-not-found]  # the suite's own
    except ImportError:
        return
    host, _, port = address.rpartition(":")

    def check_docker_available() -> Any:
        return dc.DockerHostInfo(is_tcp=True, host=host, port=int(port))

    def run(self: Any, image: str, ports: list[str], environment: Any = None) -> Any:
        # Every port the suite asks for is the broker's one AMQP port: the TLS port's
        # tests are skipped by the runner (they need the image's certificates).
        return dc.ContainerInfo(id="baton", ports={p: int(port) for p in ports}, host=host)

    def nothing(self: Any, container_id: str) -> None:
        return None

    dc.check_docker_available = check_docker_available
    dc.DockerClient.run = run
    dc.DockerClient.kill = nothing
    dc.DockerClient.remove = nothing


if os.environ.get("BATON_SUITE_DOCKER_AMQP"):
    _answer_docker(os.environ["BATON_SUITE_DOCKER_AMQP"])


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        reason = _SKIPS.get(test_id(item.nodeid))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
