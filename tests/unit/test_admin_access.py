"""The admin listener's one access check, and its JSON errors for refused peers."""

from __future__ import annotations

import pytest

from batonmq.broker.admin import access_refusal


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"])
def test_loopback_peers_are_served(peer: str) -> None:
    assert access_refusal(peer) is None


@pytest.mark.parametrize(
    "peer", ["10.0.0.5", "192.168.1.20", "8.8.8.8", "::ffff:10.1.2.3", "fe80::1", "2001:db8::1"]
)
def test_other_peers_are_refused_with_a_reason(peer: str) -> None:
    refusal = access_refusal(peer)
    assert refusal is not None and "loopback" in refusal and peer in refusal


@pytest.mark.parametrize("peer", [None, "", "not-an-address"])
def test_an_unknown_peer_is_refused(peer: str | None) -> None:
    assert access_refusal(peer) is not None
