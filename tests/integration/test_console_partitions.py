"""The console's partitions panel, in a real headless Chromium (docs/admin.md "Console"):
a broker on a log of 2 data partitions shows one row per data partition, whose applied
offsets rise after publishes and whose lag is known; each queue shows its partition in
the list and in its panel; a one-log broker shows neither the panel nor the column. On
three brokers with replica groups of two, each row shows its partition's group, a
partition the broker does not apply shows as applied by other brokers, and a group short
of a majority of live replicas is flagged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batonmq import clients
from tests.helpers import eventually_sync
from tests.integration.conftest import BrokerProcess, brokers_of, started
from tests.integration.test_admin import ADMIN, admin_of
from tests.integration.test_console import (
    browser,
    cell,
    open_console,
    page_errors,
    queue_cell,
    queue_row,
    wait_for,
)

from selenium.webdriver.common.by import By  # noqa: E402 (after test_console's importorskip)
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

pytestmark = pytest.mark.integration

__all__ = ["browser"]  # the fixture, imported for these tests


@pytest.fixture
def split_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """One broker on a log of a control partition and 2 data partitions."""
    for (b,) in started([BrokerProcess(tmp_path / "split", extra=[*ADMIN, "--partitions", "2"])]):
        yield b


@pytest.fixture
def one_log_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """One broker on a log of one partition, whatever BATON_TEST_PARTITIONS says."""
    for (b,) in started([BrokerProcess(tmp_path / "one", extra=[*ADMIN, "--partitions", "1"])]):
        yield b


@pytest.fixture
def grouped_three(tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Three brokers, 2 data partitions, groups of 2, a broker out of the view kept (not
    replaced) for 10 minutes."""
    yield from started(brokers_of(
        tmp_path, f"file:{tmp_path / 'shared-log'}", 3,
        [*ADMIN, "--partitions", "2", "--replicas", "2", "--replace-after-ms", "600000"],
    ))


def _partition_rows(browser: WebDriver) -> dict[str, dict[str, str]]:
    """The partitions table: partition -> its shown fields."""
    fields = ("leader", "status", "queues", "applied", "lag", "checkpoint",
              "forwards_pending", "dead_letters_in_flight")
    return {
        str(row.get_attribute("data-partition")): {f: cell(row, f) for f in fields}
        for row in browser.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")
    }


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_partitions_panel_shows_each_data_partition_and_each_queue_its_own(
    browser: WebDriver, split_broker: BrokerProcess
) -> None:
    with clients.sync.connect(split_broker.address) as conn:
        conn.declare_queue("on-one", partition=1)
        conn.declare_queue("on-two", partition=2)
        open_console(browser, admin_of(split_broker))
        section = browser.find_element(By.ID, "partitions-section")
        wait_for(browser, section.is_displayed, "the partitions panel")
        rows = wait_for(browser, lambda: (r := _partition_rows(browser)) and
                        all(v["queues"] == "1" for v in r.values()) and r,
                        "a queue on each data partition")
        assert sorted(rows) == ["1", "2"], rows
        node_id = conn.topology()["node_id"]
        for row in rows.values():
            assert row["leader"] == node_id, row
            assert "member" in row["status"] and "healthy" in row["status"], row
            assert row["forwards_pending"] == "0" and row["dead_letters_in_flight"] == "0", row
        assert browser.find_element(By.ID, "pt-count").text == "2"
        before = {p: _number(r["applied"]) for p, r in rows.items()}

        # Publishes on both partitions: each row's applied offset rises, its lag is known.
        conn.publish_batch("on-one", [b"a"] * 50)
        conn.publish_batch("on-two", [b"b"] * 50)
        conn.publish_batch("on-two", [b"c"] * 50)
        risen = wait_for(browser, lambda: (r := _partition_rows(browser)) and all(
            _number(r[p]["applied"]) > before[p] for p in before) and r,
            "both partitions' applied offsets risen")
        for row in risen.values():
            assert _number(row["lag"]) >= 0, row  # a number, not "unknown"
        wait_for(browser, lambda: all(r["lag"] == "0" for r in _partition_rows(browser).values()),
                 "both partitions caught up (lag 0)")

    # Each queue's partition: in the list, and in its panel.
    assert queue_cell(browser, "on-one", "partition") == "1"
    assert queue_cell(browser, "on-two", "partition") == "2"
    header = browser.find_element(By.CSS_SELECTOR, "#queues thead th.partition")
    assert header.is_displayed() and header.text.lower() == "partition"
    row = queue_row(browser, "on-two")
    assert row is not None
    row.find_element(By.CSS_SELECTOR, 'button[data-action="open"]').click()
    wait_for(browser, browser.find_element(By.ID, "d-partition-wrap").is_displayed,
             "the queue panel's partition")
    assert browser.find_element(By.ID, "d-partition").text == "2"
    assert page_errors(browser) == []


def test_a_one_log_broker_shows_no_partitions(
    browser: WebDriver, one_log_broker: BrokerProcess
) -> None:
    with clients.sync.connect(one_log_broker.address) as conn:
        conn.declare_queue("plain")
        conn.publish_batch("plain", [b"p"] * 3)
    open_console(browser, admin_of(one_log_broker))
    wait_for(browser, lambda: queue_cell(browser, "plain", "ready") == "3", "the queue")
    assert not browser.find_element(By.ID, "partitions-section").is_displayed()
    assert browser.find_elements(By.CSS_SELECTOR, "#partitions tbody tr") == []
    # Its queues' partition column is not shown either.
    assert not browser.find_element(By.CSS_SELECTOR, "#queues thead th.partition").is_displayed()
    row = queue_row(browser, "plain")
    assert row is not None
    assert not row.find_element(By.CSS_SELECTOR, 'td[data-field="partition"]').is_displayed()
    row.find_element(By.CSS_SELECTOR, 'button[data-action="open"]').click()
    wait_for(browser, browser.find_element(By.ID, "detail").is_displayed, "the queue panel")
    assert not browser.find_element(By.ID, "d-partition-wrap").is_displayed()
    assert page_errors(browser) == []


def _groups_settled(address: str, nodes: list[str]) -> dict[int, dict[str, Any]]:
    """The groups once each has 2 live replicas and the brokers ``nodes`` hold 1 or 2."""
    def probe() -> dict[str, Any]:
        with clients.sync.connect(address) as conn:
            return conn.topology()

    def settled(t: dict[str, Any]) -> bool:
        gs = t.get("groups") or []
        if len(gs) != 2 or any(g["replicas"] is None or len(g["replicas"]) != 2
                               or g["joining"] or g["live_replicas"] != 2 for g in gs):
            return False
        held = [sum(n in g["replicas"] for g in gs) for n in nodes]
        return max(held) - min(held) <= 1

    top = eventually_sync(probe, "groups of 2, all live, spread", timeout=60, until=settled)
    return {g["partition"]: g for g in top["groups"]}


def test_the_partitions_panel_shows_replica_groups_and_flags_a_group_short_of_a_majority(
    browser: WebDriver, grouped_three: list[BrokerProcess]
) -> None:
    groups = _groups_settled(grouped_three[0].address, [b.node_id for b in grouped_three])
    by_node = {b.node_id: b for b in grouped_three}
    # A broker in one group only: its other partition is applied by other brokers.
    held = {b.node_id: [k for k, g in groups.items() if b.node_id in g["replicas"]]
            for b in grouped_three}
    viewer = by_node[next(n for n, ks in held.items() if len(ks) == 1)]
    (mine,) = held[viewer.node_id]
    other = 3 - mine
    open_console(browser, admin_of(viewer))
    rows = wait_for(browser, lambda: (r := _group_rows(browser)) and len(r) == 2 and r,
                    "a row per data partition")
    assert "applied by other brokers" in rows[str(other)]["status"], rows
    assert "applied by other brokers" not in rows[str(mine)]["status"], rows
    assert "member" in rows[str(mine)]["status"], rows
    for k, g in groups.items():
        shown = rows[str(k)]["group"]
        assert all(n in shown for n in g["replicas"]) and "(2/2 live)" in shown, rows
        assert "no majority" not in rows[str(k)]["status"], rows
    # A replica of the other partition that is not in this broker's group goes: that
    # group has 1 of its 2 replicas live, fewer than a majority.
    victim = by_node[next(n for n in groups[other]["replicas"] if n not in groups[mine]["replicas"])]
    victim.kill9()
    flagged = wait_for(browser, lambda: (r := _group_rows(browser)) and
                       "no majority: 1 of 2 live" in r[str(other)]["status"] and r,
                       "the group short of a majority flagged", timeout=60)
    assert "(1/2 live)" in flagged[str(other)]["group"], flagged
    assert "no majority" not in flagged[str(mine)]["status"], flagged
    assert page_errors(browser) == []


def _group_rows(browser: WebDriver) -> dict[str, dict[str, str]]:
    return {
        str(row.get_attribute("data-partition")): {f: cell(row, f) for f in ("status", "group")}
        for row in browser.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")
    }
