"""The admin listener's pure checks (broker/admin_auth.py): Host and Origin, HTTP Basic
credentials, console sessions with their idle time, and remembered Basic logins."""

from __future__ import annotations

import pytest

from batonmq.broker.admin_auth import BasicCache, HostCheck, Sessions, basic_credentials


@pytest.mark.parametrize("host", [
    "127.0.0.1:9671", "127.0.0.1", "[::1]:9671", "10.1.2.3:9671", "localhost:9671",
    "LOCALHOST", "app.localhost:9671", "baton.example", "baton.example:9671",
    "proxy.example:443",
])
def test_ip_addresses_localhost_and_allowed_names_are_served(host: str) -> None:
    check = HostCheck("baton.example, proxy.example:443", port=9671)
    assert check.host_refusal(host) is None


@pytest.mark.parametrize("host", [
    "attacker.example", "attacker.example:9671", "127.0.0.1.nip.io:9671",
    "localhost:1234", "proxy.example:9671", "", None, "[::1", "a:b:c", "x:99999",
])
def test_other_names_ports_and_malformed_hosts_are_refused(host: str | None) -> None:
    check = HostCheck("baton.example, proxy.example:443", port=9671)
    assert check.host_refusal(host) is not None


def test_a_star_allows_any_host() -> None:
    assert HostCheck("*", port=1).host_refusal("anything.example:5") is None


@pytest.mark.parametrize("origin, host, scheme, ok", [
    (None, "127.0.0.1:9671", "http", True),
    ("http://127.0.0.1:9671", "127.0.0.1:9671", "http", True),
    ("https://baton.example", "baton.example:443", "https", True),
    ("http://127.0.0.2:8766", "127.0.0.1:9671", "http", False),
    ("http://127.0.0.1:9671", "127.0.0.1:9671", "https", False),
    ("http://localhost:9671", "127.0.0.1:9671", "http", False),
    ("null", "127.0.0.1:9671", "http", False),
    ("file://", "127.0.0.1:9671", "http", False),
])
def test_an_origin_must_be_the_listeners_own(
    origin: str | None, host: str, scheme: str, ok: bool
) -> None:
    assert (HostCheck.origin_refusal(origin, host, scheme) is None) == ok


def test_basic_credentials_are_parsed_or_refused() -> None:
    assert basic_credentials(None) is None
    assert basic_credentials("Bearer abc") is None
    assert basic_credentials("Basic Z3Vlc3Q6Z3U6ZXN0") == ("guest", "gu:est")
    for bad in ("Basic !!!", "Basic Z3Vlc3Q="):  # not base64; no colon
        with pytest.raises(ValueError):
            basic_credentials(bad)


def test_a_session_ends_when_idle_logged_out_or_its_user_changes() -> None:
    now = [100.0]
    sessions = Sessions(30.0, lambda: now[0])
    key = {"alice": b"k1"}
    token, session = sessions.start("alice", b"k1")
    assert sessions.get(token, key.get) is session and session.csrf
    now[0] += 29  # each request restarts the idle clock
    assert sessions.get(token, key.get) is session
    now[0] += 29
    assert sessions.get(token, key.get) is session
    now[0] += 31
    assert sessions.get(token, key.get) is None and len(sessions) == 0
    token, _ = sessions.start("alice", b"k1")
    key["alice"] = b"k2"  # a new password
    assert sessions.get(token, key.get) is None
    token, _ = sessions.start("alice", b"k2")
    del key["alice"]  # deleted
    assert sessions.get(token, key.get) is None
    key["alice"] = b"k2"
    token, _ = sessions.start("alice", b"k2")
    assert sessions.end(token) and not sessions.end(token)
    assert sessions.get(token, key.get) is None and sessions.get(None, key.get) is None


def test_a_remembered_basic_login_misses_once_the_password_changes() -> None:
    cache = BasicCache(size=2)
    cache.add("alice", "pw", b"k1")
    assert cache.hit("alice", "pw", b"k1")
    assert not cache.hit("alice", "other", b"k1")
    assert not cache.hit("alice", "pw", b"k2")  # a new password
    assert not cache.hit("alice", "pw", None)  # deleted
    cache.add("bob", "pw", b"b")
    cache.add("carol", "pw", b"c")  # the least recently used (alice) goes
    assert not cache.hit("alice", "pw", b"k1") and cache.hit("carol", "pw", b"c")
