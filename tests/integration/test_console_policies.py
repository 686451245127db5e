"""The console's policies, exchanges, bindings, publishing and getting, in a real
headless Chromium (docs/admin.md "Console"): a policy added on the page applies to a
matching queue (its row and its panel name the policy and show the effective settings),
a bad definition shows the broker's one line and writes nothing, a policy is cleared
after a confirm; the exchanges and bindings are listed; a message published through an
exchange and one published to a queue arrive; a get requeues, then acks (checked
through the client)."""

from __future__ import annotations

import json

import pytest

from batonmq import clients
from tests.integration.conftest import BrokerProcess
from tests.integration.test_admin import admin_broker, admin_of
from tests.integration.test_console import (
    browser,
    cell,
    open_console,
    page_errors,
    queue_cell,
    wait_for,
)

from selenium.webdriver.common.by import By  # noqa: E402 (after test_console's importorskip)
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = pytest.mark.integration

__all__ = ["admin_broker", "browser"]  # the fixtures, imported for these tests


def _row(browser: WebDriver, table: str, attribute: str, value: str) -> WebElement | None:
    # Compared as attribute values, not put into a selector: names are user input.
    for row in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr"):
        if row.get_attribute(attribute) == value:
            return row
    return None


def _click(browser: WebDriver, table: str, attribute: str, value: str, action: str) -> None:
    """Click a row's button, finding the row again if a poll drew the table anew."""
    def click() -> bool:
        row = _row(browser, table, attribute, value)
        if row is None:
            return False
        row.find_element(By.CSS_SELECTOR, f'button[data-action="{action}"]').click()
        return True

    wait_for(browser, click, f"the {action} button of {value}")


def _fill(browser: WebDriver, field: str, text: str) -> None:
    box = browser.find_element(By.ID, field)
    box.clear()
    box.send_keys(text)


def _notice(browser: WebDriver, *words: str) -> str:
    notice = browser.find_element(By.ID, "notice")
    return str(wait_for(browser, lambda: notice.is_displayed()
                        and all(w in notice.text for w in words) and notice.text,
                        f"a notice saying {words}"))


def test_a_policy_added_on_the_page_applies_then_is_cleared(
    browser: WebDriver, admin_broker: BrokerProcess
) -> None:
    with clients.sync.connect(admin_broker.address) as conn:
        conn.declare_queue("jobs.a", max_length=100)
        conn.declare_queue("other")
        open_console(browser, admin_of(admin_broker))
        wait_for(browser, lambda: queue_cell(browser, "jobs.a", "policy") == "–", "jobs.a's row")
        assert browser.find_element(By.ID, "policies-empty").is_displayed()

        # A bad definition: the broker's one line, nothing written.
        _fill(browser, "pa-name", "cap")
        _fill(browser, "pa-pattern", "^jobs\\.")
        _fill(browser, "pa-priority", "1")
        _fill(browser, "pa-definition", json.dumps({"max-lenght": 5}))
        browser.find_element(By.ID, "pa-add").click()
        said = _notice(browser, "Add policy failed")
        assert "unknown policy key 'max-lenght'" in said
        assert conn.list_policies() == []

        _fill(browser, "pa-definition", json.dumps({"max-length": 5, "delivery-limit": 3}))
        browser.find_element(By.ID, "pa-add").click()
        _notice(browser, "Policy “cap” added", "1 queue(s)")
        row = wait_for(browser, lambda: _row(browser, "policies", "data-policy", "cap"),
                       "the policy's row")
        assert (cell(row, "pattern"), cell(row, "priority")) == ("^jobs\\.", "1")
        assert json.loads(cell(row, "definition")) == {"delivery-limit": 3, "max-length": 5}
        wait_for(browser, lambda: queue_cell(browser, "jobs.a", "policy") == "cap",
                 "the queue's policy")
        assert queue_cell(browser, "other", "policy") == "–"
        stats = conn.queue_stats("jobs.a")
        assert (stats["policy"], stats["max_length"], stats["delivery_limit"]) == ("cap", 5, 3)

        # The queue's panel shows its effective settings and the policy.
        _click(browser, "queues", "data-queue", "jobs.a", "open")
        wait_for(browser, lambda: browser.find_element(By.ID, "d-policy").text == "cap",
                 "the panel's policy")
        settings = browser.find_element(By.ID, "d-settings").text
        assert "max-length 5" in settings and "delivery-limit 3" in settings

        # Cleared after a confirm: the declared settings again.
        dialog = browser.find_element(By.ID, "confirm-dialog")
        _click(browser, "policies", "data-policy", "cap", "clear")
        wait_for(browser, dialog.is_displayed, "the confirm dialog")
        assert "cap" in browser.find_element(By.ID, "confirm-text").text
        browser.find_element(By.ID, "confirm-ok").click()
        _notice(browser, "Cleared policy “cap”")
        wait_for(browser, lambda: _row(browser, "policies", "data-policy", "cap") is None,
                 "the policy's row gone")
        wait_for(browser, lambda: browser.find_element(By.ID, "d-policy").text == "none",
                 "the panel without a policy")
        assert "max-length 100" in browser.find_element(By.ID, "d-settings").text
        assert conn.queue_stats("jobs.a")["max_length"] == 100
        # The page logs the refused request of the bad definition, and nothing else.
        assert [e for e in page_errors(browser) if "400 (Bad Request)" not in e] == []


def test_exchanges_bindings_publish_and_get_on_the_page(
    browser: WebDriver, admin_broker: BrokerProcess
) -> None:
    with clients.sync.connect(admin_broker.address) as conn:
        conn.declare_queue("orders.in")
        conn.declare_exchange("orders.x", "topic")
        conn.bind_queue("orders.in", "orders.x", "o.*")
        open_console(browser, admin_of(admin_broker))

        def listed() -> tuple[str, str, str, bool] | None:
            x = _row(browser, "exchanges", "data-exchange", "orders.x")
            b = _row(browser, "bindings", "data-binding", "orders.x orders.in")
            if x is None or b is None:
                return None
            return (cell(x, "type"), cell(x, "bindings"), cell(b, "routing_key"),
                    _row(browser, "exchanges", "data-exchange", "amq.topic") is not None)

        assert wait_for(browser, listed, "the exchange and its binding") == (
            "topic", "1", "o.*", True)

        # Publish through the exchange.
        Select(browser.find_element(By.ID, "xp-exchange")).select_by_value("orders.x")
        _fill(browser, "xp-key", "o.1")
        _fill(browser, "xp-body", "first")
        _fill(browser, "xp-headers", '{"kind": "test"}')
        browser.find_element(By.ID, "xp-send").click()
        _notice(browser, "Published through exchange “orders.x” to orders.in")
        _fill(browser, "xp-key", "nowhere")
        browser.find_element(By.ID, "xp-send").click()
        _notice(browser, "it reached no queue")
        assert conn.queue_stats("orders.in")["ready"] == 1

        # Publish to the queue from its panel.
        _click(browser, "queues", "data-queue", "orders.in", "open")
        _fill(browser, "qp-body", "second")
        _fill(browser, "qp-headers", "[1]")
        browser.find_element(By.ID, "qp-send").click()
        _notice(browser, "Publish failed", "Headers must be a JSON object")
        _fill(browser, "qp-headers", "")
        browser.find_element(By.ID, "qp-send").click()
        _notice(browser, "Published through the default exchange to orders.in")
        wait_for(browser, lambda: queue_cell(browser, "orders.in", "ready") == "2", "2 ready")

        # Get one and requeue it: still there, its delivery count unchanged.
        _fill(browser, "qg-count", "1")
        Select(browser.find_element(By.ID, "qg-mode")).select_by_value("requeue")
        browser.find_element(By.ID, "qg-get").click()
        _notice(browser, "Got 1 message(s)", "requeued")
        got = browser.find_elements(By.CSS_SELECTOR, "#got tbody tr")
        assert len(got) == 1 and "first" in got[0].text and "kind=test" in got[0].text
        stats = conn.queue_stats("orders.in")
        assert (stats["ready"], stats["accepted"], stats["acquired"]) == (2, 0, 0)
        # Get both and ack them: gone.
        _fill(browser, "qg-count", "5")
        Select(browser.find_element(By.ID, "qg-mode")).select_by_value("ack")
        browser.find_element(By.ID, "qg-get").click()
        _notice(browser, "Got 2 message(s)", "acked")
        bodies = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#got tbody tr")]
        assert len(bodies) == 2 and "first" in bodies[0] and "second" in bodies[1]
        stats = conn.queue_stats("orders.in")
        assert (stats["ready"], stats["accepted"], stats["acquired"]) == (0, 2, 0)
        # Nothing more to get.
        browser.find_element(By.ID, "qg-get").click()
        _notice(browser, "Got 0 message(s)")
        wait_for(browser, lambda: browser.find_element(By.ID, "got-empty").is_displayed(),
                 "the empty line")
        assert page_errors(browser) == []
