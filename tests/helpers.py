"""Waiting and checking in tests, in one place.

Tests wait for something to happen by polling it with a deadline, never by sleeping a
guessed time: :func:`eventually` (async) and :func:`eventually_sync` (blocking) poll a
probe until its value is acceptable and, on timeout, fail with an ``AssertionError``
that says what was awaited and the last value seen. The rest is built on them:
:func:`wait_stats` / :func:`wait_stats_sync` (a queue's counters reach given values),
:func:`equal_digests` (replicas at one applied offset have one digest), :func:`drain`
(consume and ack what a queue holds), :func:`collect` (read exactly so many records of
a log) and :func:`decode_frames` (every complete frame a codec holds).

A sleep left in a test is not synchronisation: it lets time pass on purpose (to show
that nothing happens meanwhile, or to pace a load or a fault) and says so in a comment.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar, cast

from batonmq import clients
from batonmq.clients.wire import NEED_DATA, Frame, FrameCodec
from batonmq.cluster.log import Log, Record

__all__ = [
    "Addressed",
    "collect",
    "decode_frames",
    "drain",
    "equal_digests",
    "eventually",
    "eventually_sync",
    "now",
    "topology",
    "wait_stats",
    "wait_stats_sync",
]

T = TypeVar("T")


def _truthy(value: object) -> bool:
    return bool(value)


def _timed_out(what: str, timeout: float, last: object, context: Callable[[], str] | None) -> AssertionError:
    text = f"not within {timeout:g}s: {what}; last seen: {last!r}"
    if context is not None:
        text += "\n" + context()
    return AssertionError(text)


async def eventually(
    probe: Callable[[], Awaitable[T]],
    what: str,
    *,
    timeout: float = 10.0,
    until: Callable[[T], bool] = _truthy,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
    context: Callable[[], str] | None = None,
) -> T:
    """Await ``probe()`` every ``interval`` seconds until ``until(value)`` holds.

    Args:
        probe: what to look at; an exception it raises ends the wait (and fails the
            test) unless it is one of ``ignore``.
        what: what is awaited, for the failure message.
        timeout: seconds before giving up.
        until: when the value is the awaited one (default: it is true).
        interval: seconds between two probes.
        ignore: exceptions that count as "not yet" (kept as the last value seen).
        context: more to say on timeout (e.g. a process's output), asked for then.

    Returns:
        The first accepted value.

    Raises:
        AssertionError: not within ``timeout``; names ``what`` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = await probe()
        except ignore as exc:
            last = exc
        else:
            if until(value):
                return value
            last = value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, last, context)
        await asyncio.sleep(interval)


async def now(value: T) -> T:
    """``value`` as an awaitable, for :func:`eventually` to poll in-process state:
    ``await eventually(lambda: now(len(done)), "all consumed", until=lambda n: n == 10)``."""
    return value


def eventually_sync(
    probe: Callable[[], T],
    what: str,
    *,
    timeout: float = 10.0,
    until: Callable[[T], bool] = _truthy,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
    context: Callable[[], str] | None = None,
) -> T:
    """:func:`eventually` for blocking code: call ``probe()`` until ``until(value)``.

    Returns:
        The first accepted value.

    Raises:
        AssertionError: not within ``timeout``; names ``what`` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except ignore as exc:
            last = exc
        else:
            if until(value):
                return value
            last = value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout, last, context)
        time.sleep(interval)


# --- brokers -------------------------------------------------------------------------------


class Addressed(Protocol):
    """Anything with a broker's client address (a test's broker process)."""

    @property
    def address(self) -> str: ...


async def topology(address: str) -> dict[str, Any]:
    """The topology as the broker at ``address`` applied it (one connection)."""
    async with await clients.connect(address, timeout=5) as conn:
        return await conn.topology()


async def equal_digests(brokers: Iterable[Addressed], timeout: float = 30.0) -> None:
    """Replicas that applied the same offset must have the same digest (it covers the
    whole replicated state). The log keeps moving with heartbeats, so look until they
    report one applied offset, then compare.

    Raises:
        AssertionError: different digests at one offset, or never one offset in time.
    """
    addresses = [b.address for b in brokers]

    async def tops() -> list[dict[str, Any]]:
        return [await topology(a) for a in addresses]

    same = await eventually(
        tops,
        f"replicas {addresses} at one applied offset",
        timeout=timeout,
        until=lambda ts: len({t["applied"] for t in ts}) == 1,
        interval=0.02,
    )
    assert len({t["digest"] for t in same}) == 1, same
    # A log of several partitions: each data partition compared alike, on its own, among
    # the brokers that apply it (with replica groups, its group's brokers only).
    numbers = sorted({r["partition"] for t in same for r in t.get("partitions", ())})
    for k in numbers:

        def rows(ts: list[dict[str, Any]], k: int = k) -> list[dict[str, Any]]:
            return [r for t in ts for r in t.get("partitions", ()) if r["partition"] == k]

        at_one = await eventually(
            tops,
            f"replicas {addresses} at one applied offset of data partition {k}",
            timeout=timeout,
            until=lambda ts: len({r["applied"] for r in rows(ts)}) == 1,
            interval=0.02,
        )
        assert len({r["digest"] for r in rows(at_one)}) == 1, rows(at_one)


async def wait_stats(
    conn: clients.Connection, queue: str, *, timeout: float = 10.0, **expected: object
) -> dict[str, Any]:
    """Poll ``queue_stats(queue)`` until every counter named in ``expected`` has its value.

    Returns:
        The stats that matched.

    Raises:
        AssertionError: not within ``timeout`` (with the last stats seen).
    """
    return await eventually(
        lambda: conn.queue_stats(queue),
        f"queue {queue!r} stats with {expected}",
        timeout=timeout,
        until=lambda s: all(s.get(k) == v for k, v in expected.items()),
    )


def wait_stats_sync(
    conn: clients.sync.SyncConnection, queue: str, *, timeout: float = 10.0, **expected: object
) -> dict[str, Any]:
    """:func:`wait_stats` with the blocking client."""
    return eventually_sync(
        lambda: conn.queue_stats(queue),
        f"queue {queue!r} stats with {expected}",
        timeout=timeout,
        until=lambda s: all(s.get(k) == v for k, v in expected.items()),
        interval=0.02,
    )


async def drain(
    address: str,
    queue: str,
    *,
    idle: float = 1.0,
    count: int | None = None,
    timeout: float = 60.0,
) -> list[clients.Message]:
    """Consume ``queue`` through ``address`` and ack every message (confirmed).

    Without ``count`` it stops once nothing arrives for ``idle`` seconds: that quiet
    time is what shows nothing more (no duplicate, no late message) is there. With
    ``count`` it stops as soon as that many came.

    Returns:
        The messages, in delivery order.

    Raises:
        AssertionError: ``count`` messages did not come within ``timeout``.
    """
    got: list[clients.Message] = []
    deadline = time.monotonic() + timeout
    async with await clients.connect(address) as conn:
        async with conn.consume(queue, prefetch=500) as consumer:
            while count is None or len(got) < count:
                wait = idle if count is None else max(0.0, deadline - time.monotonic())
                batch = await consumer.get_many(500, timeout=wait)
                if not batch:
                    if count is not None:
                        raise AssertionError(
                            f"not within {timeout:g}s: {count} messages from {queue!r}; "
                            f"last seen: {len(got)}"
                        )
                    break
                got.extend(batch)
                await consumer.ack_many(batch, confirm=True)
    return got


# --- the log and the codec -----------------------------------------------------------------


async def collect(
    log: Log,
    start: int,
    count: int,
    *,
    max_batch: int = 1024,
    timeout: float = 20.0,
    into: list[Record] | None = None,
) -> list[Record]:
    """Read exactly ``count`` records of ``log`` from offset ``start``.

    Each batch read must be non-empty and at most ``max_batch`` records (the log's
    contract). ``into``, if given, receives the records as they come, so a test can
    wait until a reader has got so far.

    Raises:
        AssertionError: a bad batch, or a record count other than ``count``.
        TimeoutError: not ``count`` records within ``timeout``.
    """
    got: list[Record] = [] if into is None else into

    async def run() -> list[Record]:
        reader = cast(AsyncGenerator[list[Record], None], log.read(start, max_batch=max_batch))
        async with contextlib.aclosing(reader):
            async for batch in reader:
                assert batch, "read yielded an empty batch"
                assert len(batch) <= max_batch
                got.extend(batch)
                if len(got) >= count:
                    break
        assert len(got) == count, f"read {len(got)} records, expected exactly {count}"
        return list(got)

    return await asyncio.wait_for(run(), timeout)


def decode_frames(codec: FrameCodec) -> list[Frame]:
    """Every complete frame the codec holds, in order (ProtocolError propagates)."""
    out: list[Frame] = []
    while True:
        frame = codec.next_frame()
        if frame is NEED_DATA:
            return out
        assert isinstance(frame, Frame)
        out.append(frame)


def login_frames(
    user: str = "guest", password: str = "guest", corr: int = 1, name: str = "raw"
) -> tuple[Frame, Callable[[Frame], Frame], Callable[[Frame], None]]:
    """A raw client's login, frame by frame: the Hello to send, then a function that
    turns the broker's AuthChallenge into the AuthResponse to send, then one that checks
    the broker's HelloOk (clients/scram.py; for tests that build frames by hand)."""
    from batonmq.clients import scram, wire

    exchange = scram.ClientExchange(user, password)
    hello = wire.Hello(corr, wire.PROTOCOL_VERSION, name,
                       {"mechanism": scram.MECHANISM, "message": exchange.first()})

    def respond(challenge: Frame) -> Frame:
        assert isinstance(challenge, wire.AuthChallenge), challenge
        return wire.AuthResponse(corr, {"message": exchange.final(challenge.data["message"])})

    def check(ok: Frame) -> None:
        assert isinstance(ok, wire.HelloOk), ok
        exchange.verify(ok.auth["message"])

    return hello, respond, check


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` in MiB (Linux: /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def read_frame(sock: socket.socket, codec: FrameCodec) -> Frame:
    """The next frame on a blocking socket.

    Raises:
        ConnectionError: the broker closed the connection first.
    """
    while True:
        frame = codec.next_frame()
        if isinstance(frame, Frame):
            return frame
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the broker")
        codec.receive_data(data)
