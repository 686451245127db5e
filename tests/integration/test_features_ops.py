"""Feature flags for operators, against real broker processes: ``baton feature list`` and
``baton feature enable``, ``GET /api/features`` and ``POST /api/features/enable``, the
flag and format metrics, and a broker that stops applying at a record its build cannot
read (``/readyz`` 503, ``baton_apply_stopped``). A stand-in for a newer build
(tests/integration/newer_build.py) knows one flag more than this build: beside a broker
of this build, that flag is refused with the member lacking it named, and once that
member has left it is enabled (docs/operations.md "Upgrading")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batonmq.cluster.features import FEATURES, MAX_FORMAT
from batonmq.cluster.log import open_log
from tests.helpers import eventually, topology
from tests.integration.conftest import BrokerProcess
from tests.integration.newer_build import MODULE, NEWER_FLAG
from tests.integration.test_admin import ADMIN, admin_broker, admin_of, get_json, http
from tests.integration.test_cli import baton

pytestmark = pytest.mark.integration

__all__ = ["admin_broker", "http"]  # the fixtures, imported for these tests


def samples(text: str, name: str, label: str) -> dict[str, float]:
    """The samples of metric family ``name`` by the value of their ``label``."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels.get(label, ""): s.value for s in family.samples}
    raise AssertionError(f"no metric {name} in:\n{text[:2000]}")


async def metrics(http: aiohttp.ClientSession, b: BrokerProcess) -> str:
    async with http.get(f"{admin_of(b)}/metrics") as r:
        assert r.status == 200
        return await r.text()


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body) as r:
        assert r.content_type == "application/json", await r.text()
        return r.status, await r.json()


def one_line_error(r: Any) -> str:
    """The one line a refused command says on stderr (exit 1, no traceback)."""
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if not re.match(r"^\d{4}-\d\d-\d\d ", line)]
    assert len(lines) == 1 and lines[0].startswith("baton: "), r.stderr
    return str(lines[0].removeprefix("baton: "))


async def test_a_fresh_broker_lists_its_flags_enabled_through_cli_api_and_metrics(
    admin_broker: BrokerProcess, http: aiohttp.ClientSession
) -> None:
    addr, base = admin_broker.address, admin_of(admin_broker)
    me = await topology(addr)
    key = f"{me['node_id']}/{me['runtime']}"
    # A fresh cluster's leader enables every flag its build knows at its first view.
    r = baton("feature", "list", "--broker", addr)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["feature", "state", "format", "since", "supported", "by",
                                "not", "supported", "by"]
    # Every flag of this build, in the order they were added (the first two written out).
    assert re.fullmatch(
        rf"versioned_formats\s+enabled\s+2\s+0\.2\.0\s+{re.escape(me['node_id'])}\s+-",
        lines[1]), lines
    assert re.fullmatch(
        rf"user_limits\s+enabled\s+3\s+0\.3\.0\s+{re.escape(me['node_id'])}\s+-",
        lines[2]), lines
    for line, f in zip(lines[1:], FEATURES.values()):
        assert re.fullmatch(
            rf"{f.name}\s+enabled\s+{f.format}\s+{re.escape(f.since)}\s+"
            rf"{re.escape(me['node_id'])}\s+-", line), lines
    n = len(FEATURES)
    assert lines[n + 1] == f"cluster format {MAX_FORMAT}; {n} of {n} flag(s) enabled"
    assert len(lines) == n + 2, lines  # nothing disabled: no hint to enable
    r = baton("feature", "list", "--json", "--broker", addr)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["name"], x["state"], x["format"], x["supported_by"], x["unsupported_by"])
            for x in rows] == [(f.name, "enabled", f.format, [key], []) for f in FEATURES.values()]
    assert rows[0]["enabled_at"] >= 0 and rows[0]["doc"] == FEATURES["versioned_formats"].doc

    # Enabling what is enabled changes nothing, and says so.
    for args in (["versioned_formats"], ["--all"]):
        r = baton("feature", "enable", *args, "--broker", addr)
        assert (r.returncode, r.stdout) == (
            0, f"already enabled: {', '.join(args if args != ['--all'] else FEATURES)}\n"
        ), r.stderr

    # The API: the same rows and the cluster's format; enabling with the same checks.
    status, body = await get_json(http, f"{base}/api/features")
    assert status == 200 and body == {"features": rows, "format": MAX_FORMAT}
    status, body = await post(http, f"{base}/api/features/enable", {"all": True})
    assert (status, body) == (200, {"enabled": [], "format": MAX_FORMAT})
    status, body = await post(http, f"{base}/api/features/enable", {"names": ["nope"]})
    assert status == 400 and body["error"]["name"] == "InvalidArgument"
    assert body["error"]["message"] == (
        f"unknown feature flag(s) nope; this broker's build knows {', '.join(FEATURES)}")
    r = baton("feature", "enable", "nope", "--broker", addr)
    assert one_line_error(r) == body["error"]["message"]  # the same words
    for bad in ({}, {"names": []}, {"names": [1]}, {"names": "versioned_formats"},
                {"all": False}, {"all": True, "names": ["versioned_formats"]}, {"every": True}):
        status, body = await post(http, f"{base}/api/features/enable", bad)
        assert status == 400 and body["error"]["name"] == "InvalidArgument", (bad, body)
    async with http.post(f"{base}/api/features/enable", data=b"[") as resp:
        assert resp.status == 400

    text = await metrics(http, admin_broker)
    assert samples(text, "baton_feature_enabled", "feature") == dict.fromkeys(FEATURES, 1.0)
    assert samples(text, "baton_format", "") == {"": float(MAX_FORMAT)}
    assert samples(text, "baton_apply_stopped", "reason") == {"unreadable": 0.0, "error": 0.0}

    # The topology table counts the flags a member announces instead of listing them;
    # its JSON keeps the list.
    r = baton("topology", "--broker", addr)
    assert r.returncode == 0, r.stderr
    (row,) = [  # (a split log's partitions are listed below the members)
        line for line in r.stdout.splitlines()
        if line.startswith("  ") and not line.startswith("  partition ")
    ]
    assert f" {len(FEATURES)} flags " in row and "versioned_formats" not in row and "features" not in row
    r = baton("topology", "--json", "--broker", addr)
    (instance,) = json.loads(r.stdout)["instances"]
    assert instance["features"] == sorted(FEATURES) and "features" not in instance["properties"]


async def test_a_flag_a_live_member_lacks_is_refused_naming_it_and_enabled_once_it_left(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    log_url = f"file:{tmp_path / 'shared-log'}"
    old = BrokerProcess(tmp_path / "old", log_url=log_url, node_id="old-build")
    new = BrokerProcess(tmp_path / "new", log_url=log_url, node_id="new-build", extra=ADMIN,
                        module=MODULE)
    try:
        old.start()  # first: the cluster's flags are this build's
        new.start()
        base = admin_of(new)
        t = await topology(new.address)
        keys = {f"{i['node_id']}/{i['runtime']}": i["node_id"] for i in t["instances"]}
        old_key = next(k for k, n in keys.items() if n == "old-build")
        new_key = next(k for k, n in keys.items() if n == "new-build")

        async def rows() -> dict[str, Any]:
            status, body = await get_json(http, f"{base}/api/features")
            assert status == 200, body
            return {r["name"]: r for r in body["features"]}

        flags = await eventually(rows, "both members' heartbeats applied", until=lambda f: (
            f[NEWER_FLAG]["supported_by"] == [new_key]
            and f[NEWER_FLAG]["unsupported_by"] == [old_key]))
        assert flags[NEWER_FLAG]["state"] == "disabled"
        assert flags["versioned_formats"]["state"] == "enabled"

        # The newer build's broker lists the flag, disabled, and who lacks it (where).
        r = baton("feature", "list", "--broker", new.address)
        assert r.returncode == 0, r.stderr
        (line,) = [x for x in r.stdout.splitlines() if x.startswith(NEWER_FLAG)]
        assert re.fullmatch(rf"{NEWER_FLAG}\s+disabled\s+{MAX_FORMAT}\s+9\.9\.9\s+new-build\s+"
                            rf"old-build \({re.escape(old.address)}\)", line), line
        assert "enable with: baton feature enable NAME" in r.stdout
        # The older build's broker knows no such flag.
        r = baton("feature", "list", "--json", "--broker", old.address)
        assert [x["name"] for x in json.loads(r.stdout)] == list(FEATURES)
        why = one_line_error(baton("feature", "enable", NEWER_FLAG, "--broker", old.address))
        assert why.startswith(f"unknown feature flag(s) {NEWER_FLAG}")

        # Enabling is refused while a live member lacks it: one line naming that member.
        why = one_line_error(baton("feature", "enable", NEWER_FLAG, "--broker", new.address))
        assert why == (
            "cannot enable feature flags until every member supports them:"
            f" {old_key} ({old.address}) lacks {NEWER_FLAG}. Upgrade those brokers first"
            ' (docs/operations.md "Upgrading")'
        )
        one_line_error(baton("feature", "enable", "--all", "--broker", new.address))
        # The API: a conflict (409) with the same words, for names and for all.
        for body in ({"names": [NEWER_FLAG]}, {"all": True}):
            status, answer = await post(http, f"{base}/api/features/enable", body)
            assert status == 409, answer
            assert answer["error"]["message"] == why and answer["error"]["name"] == \
                "InvalidArgument"
        text = await metrics(http, new)
        assert samples(text, "baton_feature_enabled", "feature") == {
            **dict.fromkeys(FEATURES, 1.0), NEWER_FLAG: 0.0}

        # Once the older broker has left, every live member has the flag: enabled.
        old.stop()
        await eventually(rows, "the older broker gone from the live members",
                         until=lambda f: f[NEWER_FLAG]["unsupported_by"] == [])
        r = baton("feature", "enable", NEWER_FLAG, "--broker", new.address)
        assert (r.returncode, r.stdout) == (
            0, f"enabled feature flag(s) {NEWER_FLAG}; the cluster's format is {MAX_FORMAT}\n"), r.stderr
        flags = await rows()
        assert flags[NEWER_FLAG]["state"] == "enabled" and flags[NEWER_FLAG]["enabled_at"] > 0
        text = await metrics(http, new)
        assert samples(text, "baton_feature_enabled", "feature")[NEWER_FLAG] == 1.0
    finally:
        new.stop()
        old.stop()


async def test_a_record_this_build_cannot_read_stops_applying_and_readyz_says_503(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    log_url = f"file:{tmp_path / 'log'}"
    b = BrokerProcess(tmp_path / "broker", log_url=log_url, extra=ADMIN)
    b.start()
    try:
        base = admin_of(b)
        status, ready = await get_json(http, f"{base}/readyz")
        assert status == 200 and ready["apply_stopped"] is False, ready
        text = await metrics(http, b)
        assert samples(text, "baton_apply_stopped", "reason") == {"unreadable": 0.0, "error": 0.0}
        # A newer build's record: a format above this build's (cluster/codec.py).
        log = await open_log(log_url)
        try:
            offset = await log.append(
                [msgpack.packb([MAX_FORMAT + 1, "newer", "r1", 1, 0, 1, "q"])])
        finally:
            await log.close()

        async def readyz() -> tuple[int, Any]:
            return await get_json(http, f"{base}/readyz")

        status, ready = await eventually(readyz, "/readyz answers 503",
                                         until=lambda s: s[0] == 503)
        assert ready["apply_stopped"] is True and ready["healthy"] is False
        assert ready["applied"] == offset - 1  # everything before it, nothing past it
        (reason,) = ready["reasons"][:1]
        assert reason.startswith(f"stopped applying at log offset {offset}: a record this"
                                 " build cannot read (record of format"), reason
        text = await metrics(http, b)
        assert samples(text, "baton_apply_stopped", "reason") == {"unreadable": 1.0, "error": 0.0}
        assert samples(text, "baton_healthy", "") == {"": 0.0}
        r = baton("health", "--broker", b.address)
        assert r.returncode == 1 and f"stopped applying at log offset {offset}" in r.stdout, r
        r = baton("topology", "--broker", b.address)
        assert r.returncode == 1 and "this broker is UNHEALTHY: stopped applying" in r.stdout
    finally:
        b.stop()
