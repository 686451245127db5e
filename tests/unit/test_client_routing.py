"""The client's route table (clients/routing.py, docs/client.md "Routing"): pure, the
caller's clock; what a Locate answer teaches, when a route goes stale, which replica
is picked, and which errors mean "route again"."""

from __future__ import annotations

import pytest

from batonmq.clients.routing import Route, RouteTable, misrouted, send_again
from batonmq.cluster.errors import (
    ConnectionClosed,
    LogUnavailable,
    ProtocolError,
    QueueNotFound,
    ShuttingDown,
)


def _answer(
    partition: int, anywhere: bool, *addresses: str, groups: bool = True
) -> dict[str, object]:
    return {"partition": partition, "anywhere": anywhere, "addresses": list(addresses),
            "groups": groups}


def test_a_grouped_route_is_kept_for_its_ttl_then_asked_again() -> None:
    table = RouteTable(ttl=5.0)
    route = table.learn("q", _answer(2, False, "a:1", "b:2"), now=100.0)
    assert route == Route(2, False, ("a:1", "b:2"), 100.0)
    assert not table.flat
    assert table.route("q", 104.9) == route
    assert table.route("q", 105.0) is None
    assert table.route("other", 100.0) is None


def test_a_cluster_without_groups_makes_the_table_flat_until_a_broker_says_otherwise() -> None:
    table = RouteTable(ttl=5.0)
    table.learn("q", _answer(1, True, groups=False), now=0.0)
    assert table.flat
    assert table.route("q", 1e9) is not None  # never stale
    table.forget("q")
    assert not table.flat and table.route("q", 0.0) is None
    # A queue not placed yet (or not visible) on such a cluster: flat as well.
    table.learn("new", _answer(0, True, groups=False), now=0.0)
    assert table.flat


def test_clear_forgets_every_route_but_not_flatness() -> None:
    table = RouteTable()
    table.learn("a", _answer(1, True), now=0.0)
    table.learn("b", _answer(2, False, "x:1"), now=0.0)
    table.clear()
    assert table.route("a", 0.0) is None and table.route("b", 0.0) is None


def test_a_queue_not_placed_is_not_kept() -> None:
    table = RouteTable()
    route = table.learn("new", _answer(0, True), now=0.0)
    assert route.anywhere and route.partition == 0
    assert table.route("new", 0.0) is None and not table.flat


@pytest.mark.parametrize("answer", [
    {},
    {"partition": "1", "anywhere": False, "addresses": []},
    {"partition": True, "anywhere": False, "addresses": []},
    {"partition": -1, "anywhere": False, "addresses": []},
    {"partition": 1, "anywhere": 1, "addresses": []},
    {"partition": 1, "anywhere": False, "addresses": "a:1"},
    {"partition": 1, "anywhere": False, "addresses": [1], "groups": True},
    {"partition": 1, "anywhere": False, "addresses": []},
    {"partition": 1, "anywhere": False, "addresses": [], "groups": "yes"},
])
def test_a_malformed_answer_is_a_protocol_error(answer: dict[str, object]) -> None:
    with pytest.raises(ProtocolError, match="malformed Locate"):
        RouteTable().learn("q", answer, now=0.0)


def test_pick_prefers_an_open_replica_then_group_order_and_passes_over_the_dead() -> None:
    route = Route(1, False, ("a:1", "b:2", "c:3"), 0.0)
    assert RouteTable.pick(route, open_=set(), avoid=set()) == "a:1"
    assert RouteTable.pick(route, open_={"c:3", "x:9"}, avoid=set()) == "c:3"
    assert RouteTable.pick(route, open_={"c:3"}, avoid={"c:3"}) == "a:1"
    assert RouteTable.pick(route, open_=set(), avoid={"a:1"}) == "b:2"
    # Every replica avoided: still one of them (the broker answers why if wrong).
    assert RouteTable.pick(route, open_=set(), avoid={"a:1", "b:2", "c:3"}) == "a:1"
    assert RouteTable.pick(Route(1, True, (), 0.0), open_={"a:1"}, avoid=set()) is None
    assert RouteTable.pick(Route(1, False, (), 0.0), open_=set(), avoid=set()) is None


def test_dead_addresses_are_passed_over_for_a_while() -> None:
    table = RouteTable(dead_for=5.0)
    table.failed("a:1", 10.0)
    assert table.dead(12.0) == {"a:1"}
    assert table.dead(15.0) == set()


def test_misrouted_errors() -> None:
    assert misrouted(LogUnavailable(
        "data partition 2 is not applied by this broker (replica groups), and it cannot"
        " forward to its replicas (a:1)"))
    assert misrouted(LogUnavailable(
        "queue 'q' is served by other brokers now (data partition 2 moved: a:1);"
        " subscribe again"))
    assert not misrouted(LogUnavailable("the log is down"))
    assert not misrouted(QueueNotFound("queue 'q' does not exist"))
    assert not misrouted(ConnectionClosed("lost"))


@pytest.mark.parametrize("replica", [True, False])
def test_what_is_sent_again_to_another_replica(replica: bool) -> None:
    moved = LogUnavailable("queue 'q' is served by other brokers now (data partition 2 moved)")
    closing = ShuttingDown("data partition 2 is served by other brokers now; this command's"
                           " outcome is unknown")
    for resend in (True, False):
        assert send_again(moved, replica=replica, resend=resend)  # never applied there
        # In flight while the partition closed there: only an idempotent command again.
        assert send_again(closing, replica=replica, resend=resend) is resend
        assert not send_again(QueueNotFound("queue 'q' does not exist"), replica=replica,
                              resend=resend)
    # The broker stops, or stopped applying: the caller sees it.
    halted = ShuttingDown("this broker stopped applying the log at offset 16 (...); use"
                          " another broker")
    assert not send_again(halted, replica=replica, resend=True)
    assert not send_again(ShuttingDown("the broker is shutting down"), replica=replica,
                          resend=True)
    # A lost replica connection: unknown outcome; the primary channel fails over itself.
    assert send_again(ConnectionClosed("lost"), replica=replica, resend=True) is replica
    assert not send_again(ConnectionClosed("lost"), replica=replica, resend=False)
