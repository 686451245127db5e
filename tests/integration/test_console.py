"""The admin listener's web console, driven in a real headless Chromium with Selenium
(docs/admin.md "Console"): what a test puts in a broker shows on the page, a purge,
a delete, a closed connection and a handover clicked and confirmed on the page take
effect (checked through the client too), a killed broker leaves the view, a queue's
panel peeks at its messages and shows a message's history from the log, and the feature
flags panel shows a refused enable and enables a flag.

Debian's ``chromium`` and ``chromium-driver`` are used as installed (.ci/run installs
them): Selenium is given both paths, so Selenium Manager downloads nothing. Without
them these tests fail in CI and are skipped elsewhere.

``BATON_CONSOLE_SCREENSHOT=docs/console.png`` saves the documentation's screenshot,
``BATON_CONSOLE_HISTORY_SCREENSHOT=docs/console-history.png`` the one of the history panel.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from batonmq import clients
from batonmq.cluster.features import FEATURES, MAX_FORMAT
from tests.helpers import eventually_sync
from tests.integration.conftest import REPO, BrokerProcess
from tests.integration.newer_build import MODULE, NEWER_FLAG
from tests.integration.test_admin import ADMIN, admin_broker, admin_of

webdriver = pytest.importorskip("selenium.webdriver")

from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.integration

__all__ = ["admin_broker"]  # the fixture, imported for these tests

CHROMIUM = os.environ.get("BATON_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("BATON_CHROMEDRIVER", "/usr/bin/chromedriver")
MISSING = "Chromium not installed: apt-get install chromium chromium-driver"

T = TypeVar("T")


def _executable(path: str) -> str | None:
    found = shutil.which(path)
    return found if found and os.access(found, os.X_OK) else None


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WebDriver]:
    """A headless Chromium driven by the system's chromedriver."""
    chromium, driver = _executable(CHROMIUM), _executable(CHROMEDRIVER)
    if chromium is None or driver is None:
        missing = ", ".join(p for p, f in ((CHROMIUM, chromium), (CHROMEDRIVER, driver)) if not f)
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{MISSING} (missing: {missing}); CI installs them, so these tests"
                        " may not skip", pytrace=False)
        pytest.skip(f"{MISSING} (missing: {missing})")
    monkeypatch.setenv("SE_OFFLINE", "true")  # never let Selenium Manager fetch a driver
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1440,1000", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console
    drv = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        yield drv
    finally:
        drv.quit()


def wait_for(browser: WebDriver, probe: Callable[[], T], what: str, timeout: float = 15) -> T:
    """Poll the page until ``probe()`` is truthy (an element gone stale or not there yet
    counts as not yet)."""
    wait = WebDriverWait(browser, timeout, poll_frequency=0.1,
                         ignored_exceptions=(NoSuchElementException,
                                             StaleElementReferenceException))
    return wait.until(lambda _: probe(), message=f"waiting for {what}")


def queue_row(browser: WebDriver, name: str) -> WebElement | None:
    # Compared as attribute values, not put into a selector: names are user input.
    for row in browser.find_elements(By.CSS_SELECTOR, "#queues tbody tr"):
        if row.get_attribute("data-queue") == name:
            return row
    return None


def cell(row: WebElement, field: str) -> str:
    return str(row.find_element(By.CSS_SELECTOR, f'td[data-field="{field}"]').text)


def queue_cell(browser: WebDriver, name: str, field: str) -> str | None:
    row = queue_row(browser, name)
    return None if row is None else cell(row, field)


def node_statuses(browser: WebDriver) -> dict[str, str]:
    return {
        str(r.get_attribute("data-node")): str(r.get_attribute("data-status"))
        for r in browser.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")
    }


def page_errors(browser: WebDriver) -> list[str]:
    """Errors the page logged (a script error, a blocked load, a failed request); the
    browser's own request for a favicon aside."""
    return [
        str(e["message"]) for e in browser.get_log("browser")
        if e["level"] == "SEVERE" and "favicon.ico" not in str(e["message"])
    ]


def screenshot(browser: WebDriver, variable: str = "BATON_CONSOLE_SCREENSHOT",
               element: WebElement | None = None) -> None:
    """Save the page (or ``element`` of it) for the docs when ``variable`` (an environment
    variable) names a file."""
    target = os.environ.get(variable)
    if target:
        path = Path(target) if Path(target).is_absolute() else REPO / target
        if element is not None:
            assert element.screenshot(str(path)), path
            return
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1440, max(900, int(height) + 140))  # + the window's frame
        assert browser.save_screenshot(str(path)), path


def log_in(browser: WebDriver, user: str, password: str) -> None:
    """Fill in and send the console's login form (it shows while nobody is logged in)."""
    wait_for(browser, lambda: browser.find_element(By.ID, "login").is_displayed(),
             "the login screen")
    name = browser.find_element(By.ID, "login-user")
    name.clear()
    name.send_keys(user)
    browser.find_element(By.ID, "login-password").send_keys(password)
    browser.find_element(By.ID, "login-submit").click()


def open_console(browser: WebDriver, base: str, user: str = "guest",
                 password: str = "guest") -> None:
    """Open the console at ``base`` and log in (docs/admin.md "Logging in")."""
    browser.get(base + "/")
    log_in(browser, user, password)
    wait_for(browser, lambda: browser.find_element(By.ID, "main").is_displayed(),
             "the console after its login")


# An HTML-looking name: it must show as these characters, never become markup.
TRICKY = 'orders<b id="injected">&amp;</b>'


def test_console_shows_a_filled_queue_with_its_depth(
    browser: WebDriver, admin_broker: BrokerProcess
) -> None:
    with clients.sync.connect(admin_broker.address) as conn:
        conn.declare_queue(TRICKY)
        conn.publish_batch(TRICKY, [b"m%d" % i for i in range(1234)])
        conn.declare_queue("empty")
        conn.declare_queue("..")  # a browser cannot put it in a URL path
    open_console(browser, admin_of(admin_broker))
    assert browser.title == "Baton console"
    wait_for(browser, lambda: queue_cell(browser, TRICKY, "ready") == "1,234",
             "the filled queue's depth")
    row = queue_row(browser, TRICKY)
    assert row is not None
    assert cell(row, "queue").startswith(TRICKY)  # shown as text, escaped
    assert browser.find_elements(By.ID, "injected") == []
    assert cell(row, "acquired") == "0"
    assert queue_cell(browser, "empty", "ready") == "0"
    dots = queue_row(browser, "..")
    assert dots is not None
    # Open (the name), Purge, Delete.
    assert [b.is_enabled() for b in dots.find_elements(By.TAG_NAME, "button")] == [False] * 3
    assert [b.is_enabled() for b in row.find_elements(By.TAG_NAME, "button")] == [True] * 3
    header = browser.find_element(By.ID, "h-view").text
    assert header.isdigit() and int(header) >= 1
    assert browser.find_element(By.ID, "h-ready").text == "ready"
    assert not browser.find_element(By.ID, "error-banner").is_displayed()
    assert page_errors(browser) == []

    # A broker that does not answer (stopped): the banner says so, the last figures stay;
    # it goes once the broker answers again.
    banner = browser.find_element(By.ID, "error-banner")
    admin_broker.pause()
    try:
        wait_for(browser, banner.is_displayed, "the error banner of a silent broker")
        assert "no answer within" in banner.text
        assert queue_cell(browser, TRICKY, "ready") == "1,234"
    finally:
        admin_broker.resume()
    wait_for(browser, lambda: not banner.is_displayed(), "the banner gone")
    # The API gone: the page says so in its banner (and keeps the last figures).
    admin_broker.stop()
    wait_for(browser, banner.is_displayed, "the error banner")
    assert "unreachable" in banner.text
    assert queue_cell(browser, TRICKY, "ready") == "1,234"


def test_purge_clicked_and_confirmed_on_the_page_empties_the_queue(
    browser: WebDriver, admin_broker: BrokerProcess
) -> None:
    with clients.sync.connect(admin_broker.address) as conn:
        conn.declare_queue("purge-me")
        conn.publish_batch("purge-me", [b"x"] * 40)
        open_console(browser, admin_of(admin_broker))
        wait_for(browser, lambda: queue_cell(browser, "purge-me", "ready") == "40", "depth 40")
        dialog = browser.find_element(By.ID, "confirm-dialog")

        def click_purge() -> None:
            row = queue_row(browser, "purge-me")
            assert row is not None
            row.find_element(By.CSS_SELECTOR, 'button[data-action="purge"]').click()
            wait_for(browser, dialog.is_displayed, "the confirm dialog")
            assert "purge-me" in browser.find_element(By.ID, "confirm-text").text

        # Cancel first: nothing happens.
        click_purge()
        browser.find_element(By.ID, "confirm-cancel").click()
        wait_for(browser, lambda: not dialog.is_displayed(), "the dialog closed")
        assert conn.queue_stats("purge-me")["ready"] == 40
        # Then confirm.
        click_purge()
        browser.find_element(By.ID, "confirm-ok").click()
        wait_for(browser, lambda: queue_cell(browser, "purge-me", "ready") == "0", "depth 0")
        notice = browser.find_element(By.ID, "notice")
        wait_for(browser, notice.is_displayed, "the purge's notice")
        assert "Purged 40" in notice.text
        stats = conn.queue_stats("purge-me")
        assert (stats["ready"], stats["purged"]) == (0, 40)


def test_delete_a_queue_and_close_a_connection_from_the_page(
    browser: WebDriver, admin_broker: BrokerProcess
) -> None:
    with clients.sync.connect(admin_broker.address, client_name="watcher") as watcher:
        watcher.declare_queue("doomed")
        watcher.publish_batch("doomed", [b"d"] * 5)
        watcher.declare_queue("held")
        watcher.publish_batch("held", [b"h"] * 8)
        open_console(browser, admin_of(admin_broker))
        wait_for(browser, lambda: queue_cell(browser, "doomed", "ready") == "5", "doomed")
        row = queue_row(browser, "doomed")
        assert row is not None
        row.find_element(By.CSS_SELECTOR, 'button[data-action="delete"]').click()
        wait_for(browser, browser.find_element(By.ID, "confirm-dialog").is_displayed, "dialog")
        browser.find_element(By.ID, "confirm-ok").click()
        wait_for(browser, lambda: queue_row(browser, "doomed") is None, "the row gone")
        assert "doomed" not in [q["queue"] for q in watcher.list_queues()]

        victim = clients.sync.connect(admin_broker.address, client_name="victim",
                                      failover=False)

        def victim_row() -> WebElement | None:
            rows = browser.find_elements(By.CSS_SELECTOR, "#connections tbody tr")
            return next((r for r in rows if "victim" in r.text), None)

        try:
            with victim.consume("held", prefetch=3):
                wait_for(browser, lambda: queue_cell(browser, "held", "acquired") == "3",
                         "3 held by the victim")
                row = wait_for(browser, victim_row, "the victim's connection")
                row.find_element(By.CSS_SELECTOR, 'button[data-action="close"]').click()
                wait_for(browser, browser.find_element(By.ID, "confirm-dialog").is_displayed,
                         "dialog")
                assert "victim" in browser.find_element(By.ID, "confirm-text").text
                browser.find_element(By.ID, "confirm-ok").click()
                # Its consumer ended with it: the messages are back in the queue.
                wait_for(browser, lambda: queue_cell(browser, "held", "ready") == "8",
                         "ready 8")
                assert watcher.queue_stats("held")["acquired"] == 0
                assert victim_row() is None
        except clients.ConnectionClosed:
            pass  # leaving the consumer found its connection closed from the page
        finally:
            victim.close()


def test_topology_shows_a_killed_broker_leaving_the_view(
    browser: WebDriver, tmp_path: Path
) -> None:
    # The log's URL shows on the page (and in the docs' screenshot): a short path.
    log_dir = Path(tempfile.mkdtemp(prefix="baton-"))
    log_url = f"file:{log_dir / 'log'}"
    brokers = [
        BrokerProcess(tmp_path / f"node-{i}", log_url=log_url, node_id=f"node-{i}",
                      extra=ADMIN + ["--service", "billing"])
        for i in (1, 2, 3)
    ]
    try:
        for b in brokers:
            b.start()
        n1, _, n3 = brokers
        open_console(browser, admin_of(n1))
        members = {"node-1": "member", "node-2": "member", "node-3": "member"}
        wait_for(browser, lambda: node_statuses(browser) == members, "three members")
        rows = browser.find_elements(By.CSS_SELECTOR, "#nodes tbody tr")
        assert [r.get_attribute("data-node") for r in rows] == ["node-1", "node-2", "node-3"]
        assert "leader" in rows[0].text  # the first member of the view leads

        with clients.sync.connect(n1.address) as conn:
            conn.declare_queue("orders")
            conn.declare_queue("payments")
            conn.declare_queue("payments.dlq")
            conn.publish_batch("payments", [b"p"] * 320)
            with conn.consume("orders", prefetch=50) as consumer:
                # Rates are computed by the page from two polls: publish until it shows one.
                def publish_rate() -> bool:
                    conn.publish_batch("orders", [b"o"] * 20)
                    rate = queue_cell(browser, "orders", "publish_rate")
                    return rate not in (None, "–", "0.0")

                wait_for(browser, publish_rate, "a publish rate on the page")
                for _ in range(30):  # some acks, then the consumer holds its prefetch
                    consumer.next(timeout=5).ack()
                wait_for(browser, lambda: queue_cell(browser, "orders", "acquired")
                         == str(conn.queue_stats("orders")["acquired"]) != "0",
                         "the consumer's held messages")
                wait_for(browser, lambda: browser.find_elements(
                    By.CSS_SELECTOR, "#consumers tbody tr"), "the consumer's row")
                wait_for(browser, lambda: browser.find_elements(
                    By.CSS_SELECTOR, '#services tbody tr[data-service="billing"]'),
                    "the service's row")
                screenshot(browser)

        n3.kill9()
        seen: set[str] = set()

        def node3_gone() -> bool:
            statuses = node_statuses(browser)
            seen.add(statuses.get("node-3", "absent"))
            return statuses == {"node-1": "member", "node-2": "member", "node-3": "gone"}

        wait_for(browser, node3_gone, "node-3 gone", timeout=40)
        assert seen <= {"member", "suspected", "gone"}, seen
        status = eventually_sync(lambda: browser.find_element(By.ID, "h-view").text,
                                 "the header's view", until=str.isdigit)
        assert int(status) >= 2
    finally:
        for b in brokers:
            b.stop()
        shutil.rmtree(log_dir, ignore_errors=True)


def test_hand_over_a_service_from_the_page(browser: WebDriver, tmp_path: Path) -> None:
    log_url = f"file:{tmp_path / 'shared-log'}"
    brokers = [
        BrokerProcess(tmp_path / f"node-{i}", log_url=log_url, node_id=f"node-{i}",
                      extra=ADMIN + ["--service", "billing"])
        for i in (1, 2)
    ]
    try:
        for b in brokers:
            b.start()
        open_console(browser, admin_of(brokers[0]))

        def billing() -> tuple[str, str, bool] | None:
            rows = browser.find_elements(By.CSS_SELECTOR, "#services tbody tr")
            for r in rows:
                if r.get_attribute("data-service") == "billing":
                    button = r.find_element(By.CSS_SELECTOR, 'button[data-action="handover"]')
                    leader = r.find_elements(By.CSS_SELECTOR, "td")[1].get_attribute("title")
                    return str(leader), cell(r, "candidates"), button.is_enabled()
            return None

        def ready_to_hand_over() -> tuple[str, str, bool] | None:
            b = billing()
            return b if b is not None and b[1] == "2" and b[2] else None

        first = wait_for(browser, ready_to_hand_over, "billing with two candidates")
        assert first[0].startswith("node-")
        row = next(r for r in browser.find_elements(By.CSS_SELECTOR, "#services tbody tr")
                   if r.get_attribute("data-service") == "billing")
        row.find_element(By.CSS_SELECTOR, 'button[data-action="handover"]').click()
        wait_for(browser, browser.find_element(By.ID, "confirm-dialog").is_displayed, "dialog")
        browser.find_element(By.ID, "confirm-ok").click()
        def new_leader() -> tuple[str, str, bool] | None:
            b = billing()
            return b if b is not None and b[0] and b[0] != first[0] else None

        after = wait_for(browser, new_leader, "a new leader of billing", timeout=30)
        assert after[0].split("/")[0] != first[0].split("/")[0]  # the other broker leads
        with clients.sync.connect(brokers[1].address) as conn:
            info = conn.service_leader("billing")
            assert info is not None and info.leader == after[0]
    finally:
        for b in brokers:
            b.stop()


def peek_rows(browser: WebDriver) -> dict[str, WebElement]:
    return {
        str(r.get_attribute("data-position")): r
        for r in browser.find_elements(By.CSS_SELECTOR, "#peek tbody tr")
    }


def history_steps(browser: WebDriver) -> list[str]:
    """The ``what`` of each step shown, once the history (not the loading line) shows."""
    if not browser.find_element(By.ID, "h-result").is_displayed():
        return []
    return [str(r.get_attribute("data-what"))
            for r in browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")]


def ask_history(browser: WebDriver, position: str) -> None:
    field = browser.find_element(By.ID, "h-position")
    field.clear()
    field.send_keys(position)
    browser.find_element(By.ID, "h-show").click()


def test_a_queue_panel_peeks_and_shows_a_message_history_from_the_log(
    browser: WebDriver, admin_broker: BrokerProcess
) -> None:
    with clients.sync.connect(admin_broker.address) as conn:
        conn.declare_queue("life")
        positions = conn.publish_batch("life", [
            (b"order %d <b id=\"injected\">x</b>" % i + b"." * 300, {"kind": "order", "n": i})
            for i in range(4)
        ])
        assert positions == [0, 1, 2, 3]
        conn.publish("life", b"\xff\x00binary")  # position 4, not UTF-8
        with conn.consume("life", prefetch=2) as consumer:
            acked, released = consumer.next(timeout=5), consumer.next(timeout=5)
            acked.ack(confirm=True)
            released.release(confirm=True)
        assert (acked.position, released.position) == (0, 1)
        eventually_sync(lambda: conn.queue_stats("life"), "the release settled",
                        until=lambda st: (st["ready"], st["acquired"]) == (4, 0))

        open_console(browser, admin_of(admin_broker))
        row = wait_for(browser, lambda: queue_row(browser, "life"), "the queue's row")
        assert not browser.find_element(By.ID, "detail").is_displayed()
        row.find_element(By.CSS_SELECTOR, 'button[data-action="open"]').click()
        wait_for(browser, browser.find_element(By.ID, "detail").is_displayed, "the panel")
        assert browser.find_element(By.ID, "d-queue").text == "life"

        # The peek list: the ready messages, the acked one not among them.
        rows = wait_for(browser, lambda: peek_rows(browser) or None, "the peek list")
        assert sorted(rows) == ["1", "2", "3", "4"]
        assert cell(rows["1"], "delivery_count") == "0"  # a plain release is no failure
        assert cell(rows["2"], "delivery_count") == "0"
        body = cell(rows["2"], "body")
        assert body.startswith('order 2 <b id="injected">x</b>')  # text, escaped
        assert body.endswith("…") and len(body) < 200  # truncated
        assert browser.find_elements(By.ID, "injected") == []
        assert "kind=order" in cell(rows["2"], "headers")
        assert "binary, 8 B" in cell(rows["4"], "body")
        published = cell(rows["2"], "published")
        assert published[:2] == "20" and published[10] == " ", published  # UTC date, time

        # The acked message, typed in: enqueued -> acquired -> accepted, gone.
        ask_history(browser, "0")
        steps = wait_for(browser, lambda: history_steps(browser) or None, "position 0's steps")
        assert steps == ["enqueued", "acquired", "accepted"]
        assert browser.find_element(By.ID, "h-state").text == "gone"
        assert browser.find_element(By.ID, "h-pos").text == "0"
        assert not browser.find_element(By.ID, "h-note").is_displayed()  # complete
        shown = browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")
        offsets = [int(cell(r, "offset").replace(",", "")) for r in shown]
        assert offsets == sorted(offsets) and len(set(offsets)) == 3
        assert all(cell(r, "node") for r in shown)
        assert "publish key" in cell(shown[0], "details")
        assert "consumer" in cell(shown[1], "details")
        assert "acquisition 1" in cell(shown[1], "details")
        assert "delivery count 0" in cell(shown[1], "details")
        screenshot(browser, "BATON_CONSOLE_HISTORY_SCREENSHOT",
                   browser.find_element(By.ID, "detail"))

        # The released one, clicked in the peek list: back to ready. The consumer may have
        # had it again before it left (released with the rest on leaving).
        rows["1"].find_element(By.CSS_SELECTOR, 'button[data-action="history"]').click()

        def released_steps() -> list[str] | None:
            steps = history_steps(browser)
            ok = (steps[:3] == ["enqueued", "acquired", "released"]
                  and steps[3:] in ([], ["acquired", "released"]))
            return steps if ok else None

        wait_for(browser, released_steps, "position 1's steps")
        assert browser.find_element(By.ID, "h-state").text == "ready"
        assert browser.find_element(By.ID, "h-position").get_attribute("value") == "1"
        assert "selected" in str(peek_rows(browser)["1"].get_attribute("class"))

        # A position that never existed: a clear "not found", no steps.
        ask_history(browser, "999")
        empty = browser.find_element(By.ID, "history-empty")
        wait_for(browser, empty.is_displayed, "the not-found answer")
        assert "Not found" in empty.text and "999" in empty.text
        assert browser.find_element(By.ID, "h-state").text == "absent"
        assert history_steps(browser) == []
        assert not browser.find_element(By.ID, "d-error").is_displayed()
        assert page_errors(browser) == []

        # The queue gone: the panel says so (a 404 from the API), in the panel.
        conn.delete_queue("life")
        browser.find_element(By.ID, "d-refresh").click()
        error = browser.find_element(By.ID, "d-error")
        wait_for(browser, error.is_displayed, "the peek's error")
        assert "Peek failed" in error.text and "QueueNotFound" in error.text, error.text
        assert peek_rows(browser) == {}
        # The browser logs the failed request itself: that is the only error.
        logged = page_errors(browser)
        assert logged and all("/api/queues/life/peek" in e and "404" in e for e in logged), logged
        browser.find_element(By.ID, "d-close").click()
        assert not browser.find_element(By.ID, "detail").is_displayed()

        # Declared again: the panel follows the new incarnation. A history the broker is
        # slow to answer (here: stopped) shows the loading line until it answers.
        conn.declare_queue("life")
        assert conn.publish("life", b"again") == 0

        def open_life() -> bool:
            # Found and clicked in one go: a poll may render the table again in between,
            # and wait_for then tries again (the row it found went stale).
            row = queue_row(browser, "life")
            if row is None:
                return False
            row.find_element(By.CSS_SELECTOR, 'button[data-action="open"]').click()
            return True

        wait_for(browser, open_life, "the queue's row again, opened")
        wait_for(browser, lambda: sorted(peek_rows(browser)) == ["0"], "the new peek list")
        loading = browser.find_element(By.ID, "h-loading")
        admin_broker.pause()
        try:
            ask_history(browser, "0")
            wait_for(browser, loading.is_displayed, "the loading line")
            assert not browser.find_element(By.ID, "h-result").is_displayed()
        finally:
            admin_broker.resume()
        wait_for(browser, lambda: history_steps(browser) == ["enqueued"], "the new history")
        assert not loading.is_displayed()
        assert browser.find_element(By.ID, "h-state").text == "ready"


def flag_row(browser: WebDriver, name: str) -> WebElement | None:
    for row in browser.find_elements(By.CSS_SELECTOR, "#features tbody tr"):
        if row.get_attribute("data-flag") == name:
            return row
    return None


def test_feature_flags_panel_shows_a_refusal_then_enables_a_flag(
    browser: WebDriver, tmp_path: Path
) -> None:
    """A broker of this build beside one of a "newer" build (one flag more): the newer
    one's console lists that flag disabled with the member lacking it; enabling it shows
    the broker's refusal naming that member; once it has left, "Enable all" enables it."""
    log_url = f"file:{tmp_path / 'shared-log'}"
    old = BrokerProcess(tmp_path / "old", log_url=log_url, node_id="old-build")
    new = BrokerProcess(tmp_path / "new", log_url=log_url, node_id="new-build", extra=ADMIN,
                        module=MODULE)
    try:
        old.start()
        new.start()
        open_console(browser, admin_of(new))

        def lacking(name: str) -> str | None:
            row = flag_row(browser, name)
            return None if row is None else cell(row, "unsupported_by")

        wait_for(browser, lambda: lacking(NEWER_FLAG) == "old-build", "the flag old-build lacks")
        row = flag_row(browser, NEWER_FLAG)
        assert row is not None and row.get_attribute("data-state") == "disabled"
        assert cell(row, "state") == "disabled" and cell(row, "supported_by") == "new-build"
        assert (cell(row, "format"), cell(row, "since")) == (str(MAX_FORMAT), "9.9.9")
        (who,) = row.find_elements(By.CSS_SELECTOR, 'td[data-field="unsupported_by"] .badge')
        assert old.address in str(who.get_attribute("title"))  # where it runs
        current = flag_row(browser, "versioned_formats")
        assert current is not None and current.get_attribute("data-state") == "enabled"
        assert current.find_elements(By.CSS_SELECTOR, "button") == []  # nothing to enable
        assert browser.find_element(By.ID, "f-format").text == f"cluster format {MAX_FORMAT}"
        enable_all = browser.find_element(By.ID, "f-enable-all")
        assert enable_all.is_enabled()

        # Enabling it now: the confirm says who lacks it; the broker refuses, naming it.
        dialog = browser.find_element(By.ID, "confirm-dialog")
        row.find_element(By.CSS_SELECTOR, 'button[data-action="enable"]').click()
        wait_for(browser, dialog.is_displayed, "the confirm dialog")
        text = browser.find_element(By.ID, "confirm-text").text
        assert NEWER_FLAG in text and "old-build does not support it yet" in text, text
        browser.find_element(By.ID, "confirm-ok").click()
        notice = browser.find_element(By.ID, "notice")
        wait_for(browser, notice.is_displayed, "the refusal")
        assert "bad" in str(notice.get_attribute("class"))
        assert "cannot enable feature flags until every member supports them" in notice.text
        assert f"({old.address}) lacks {NEWER_FLAG}" in notice.text, notice.text
        assert "old-build/" in notice.text
        assert lacking(NEWER_FLAG) == "old-build"
        row = flag_row(browser, NEWER_FLAG)
        assert row is not None and row.get_attribute("data-state") == "disabled"

        # The older broker gone, every live member has it: "Enable all" enables it.
        old.stop()
        wait_for(browser, lambda: lacking(NEWER_FLAG) == "–", "no member lacking it",
                 timeout=30)
        enable_all.click()
        wait_for(browser, dialog.is_displayed, "the confirm dialog")
        assert "every feature flag" in browser.find_element(By.ID, "confirm-text").text
        browser.find_element(By.ID, "confirm-ok").click()
        wait_for(browser, lambda: "Enabled" in notice.text, "the enable's notice")
        assert notice.text == f"Enabled {NEWER_FLAG}; the cluster's format is {MAX_FORMAT}."

        def enabled() -> bool:
            r = flag_row(browser, NEWER_FLAG)
            return r is not None and r.get_attribute("data-state") == "enabled"

        wait_for(browser, enabled, "the flag enabled")
        row = flag_row(browser, NEWER_FLAG)
        assert row is not None and row.find_elements(By.CSS_SELECTOR, "button") == []
        assert not enable_all.is_enabled()
        with clients.sync.connect(new.address) as conn:
            states = {f["name"]: f["state"] for f in conn.list_features()}
        assert states == {**{f: "enabled" for f in FEATURES}, NEWER_FLAG: "enabled"}
        # The refused request is the only error the page logged (the browser logs it).
        logged = page_errors(browser)
        assert all("/api/features/enable" in e and "409" in e for e in logged), logged
    finally:
        new.stop()
        old.stop()


def test_the_login_screen_refuses_a_wrong_password_and_logout_ends_the_session(
    browser: WebDriver, admin_broker: BrokerProcess
) -> None:
    with clients.sync.connect(admin_broker.address) as conn:
        conn.declare_queue("behind-login")
        conn.publish_batch("behind-login", [b"x"] * 3)
    base = admin_of(admin_broker)
    browser.get(base + "/")
    assert not browser.find_element(By.ID, "main").is_displayed()
    assert queue_row(browser, "behind-login") is None  # nothing shown before a login
    log_in(browser, "guest", "not-the-password")
    error = browser.find_element(By.ID, "login-error")
    wait_for(browser, error.is_displayed, "the failed login's message")
    assert error.text.startswith("Login failed:") and "wrong user name or password" in error.text
    assert not browser.find_element(By.ID, "main").is_displayed()

    log_in(browser, "guest", "guest")
    wait_for(browser, lambda: queue_cell(browser, "behind-login", "ready") == "3", "the queue")
    assert "guest" in browser.find_element(By.ID, "h-user").text
    cookie = browser.get_cookie("baton_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    def status(path: str) -> int:
        """What the API answers the page's own fetch (with its cookie) now."""
        return int(browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {headers: {'X-Baton-Request': 'console'}})"
            ".then(r => done(r.status), () => done(-1));", path))

    assert status("/api/queues") == 200
    browser.find_element(By.ID, "logout").click()
    wait_for(browser, lambda: browser.find_element(By.ID, "login").is_displayed(),
             "the login screen after logout")
    assert browser.find_element(By.ID, "login-info").text == "Logged out."
    assert not browser.find_element(By.ID, "main").is_displayed()
    assert status("/api/queues") == 401
    # Ended on the broker too, not only forgotten by the browser: the old cookie is refused.
    browser.add_cookie({k: cookie[k] for k in ("name", "value", "path", "httpOnly", "sameSite")})
    assert browser.get_cookie("baton_session") is not None
    assert status("/api/queues") == 401
    # The refused login and the fetch after logout are the only failed loads.
    assert [e for e in page_errors(browser) if "401" not in e] == []
