"""A broker joining a live cluster: the reverse-order update (docs/design.md §8, after Qpid's).

A broker with an empty store does not replay the log's history. It appends
:class:`~batonmq.cluster.events.Join`, finds live members by the heartbeats that follow
on the log, and asks one (the *donor*) for an update over a direct connection:

1. The donor waits until it has applied the Join, then *captures* its state at
   its next batch boundary (offset ``Y``): the replicated index (queues' positions,
   view, publish keys — small: no message bodies) and a store snapshot.
2. It sends the index first; the joiner installs it as its own state at ``Y`` and
   starts applying the log from ``Y + 1`` at once: enqueues go to the back, and
   the index decides everything else, exactly as on every other replica.
3. Then the donor streams each queue's messages that were in the queue at ``Y``,
   back to front (``UpdateFront``), and ``UpdateDone`` per queue. The joiner keeps
   a message only if its own, newer index still holds it: one dequeued since ``Y``
   (accepted, rejected, expired, purged) is dropped on arrival, with no tombstones,
   because a queue's positions are never reused. A message the log dead-lettered
   before its body arrived is remembered (:attr:`Catchup.waiting`) and written to
   the dead-letter queue when it arrives.
4. A queue stays *locked* on the joiner — it declares no interest, so it can never
   own it or deliver from it — until its update is done and nothing moved into it
   still waits for a body.

The work is bounded by the queues' size at ``Y``, not by the log's history. If the
donor dies, the joiner asks another member for the queues not done yet (and the
dead-letter queues of messages still waiting): that member captures at an offset at
least the joiner's, and the joiner applies its frames only once it has applied that
far itself, so "does my index still hold it" stays the right test.

The joiner's store carries an "update incomplete" mark until the end: a joiner that
dies half-way starts again as a new broker.

Every request proves that the joiner is the runtime that appended the Join
(cluster/member_proof.py): its connection says Hello with the MEMBER mechanism, and its
``UpdateRequest`` signs the member's challenge with the key pair whose public key is in
the Join. A joiner that the view dropped before its update was done (which forgets its
key) appends its Join again before it asks another member.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from batonmq.clients import wire
from batonmq.cluster.errors import BatonError, InvalidArgument, Timeout, JoinFailed
from batonmq.cluster.codec import MalformedEvent, UnreadableRecord, decode
from batonmq.cluster.features import FEATURES
from batonmq.cluster.forwarding import OUTBOX_NAME, OUTBOX_QID
from batonmq.cluster.events import Heartbeat
from batonmq.cluster.log import Log
from batonmq.cluster.member_link import MemberLink
from batonmq.cluster.member_proof import MemberKey
from batonmq.cluster.queues import QueueState
from batonmq.cluster.state import State
from batonmq.store import Batch, Store, StoreReader, merge_headers

__all__ = [
    "Capture", "capture", "wait_applied", "update_frames", "find_donors", "Catchup",
    "MAX_UPDATE_FRAME", "Donor", "Joiner",
]

log = logging.getLogger("baton.update")

#: Frame cap on the update connection (the index of a big cluster is one frame).
MAX_UPDATE_FRAME = 1 << 30
#: Bytes of messages per UpdateFront frame.
CHUNK_BYTES = 128 * 1024
CHUNK_COUNT = 500

MessageKey = tuple[int, int]  # (qid, position)


class Donor(Protocol):
    """What the member's side of an update uses of its broker's replica
    (:class:`batonmq.cluster.node.Node` is one)."""

    @property
    def state(self) -> State: ...

    @property
    def store(self) -> Store: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def catchup(self) -> "Catchup | None":
        """The update this broker is itself taking in, if any."""
        ...

    @property
    def applied_event(self) -> asyncio.Event:
        """Set after every applied batch."""
        ...

    @property
    def apply_lock(self) -> asyncio.Lock:
        """Held while a log batch is applied and stored: state == store outside it."""
        ...

    @property
    def holds(self) -> set[int]:
        """Capture offsets of updates being served (the log is kept from there)."""
        ...


class Joiner(Protocol):
    """What the joiner's side of an update (:class:`Catchup`) uses of its broker's
    replica (:class:`batonmq.cluster.node.Node` is one)."""

    @property
    def key(self) -> str:
        """This runtime's member key."""
        ...

    @property
    def join_key(self) -> MemberKey:
        """This runtime's key pair: the public key is in its Join, the private one
        signs members' challenges (cluster/member_proof.py)."""
        ...

    async def rejoin(self) -> None:
        """Append this runtime's Join again (the same key); returns once it is applied
        here."""
        ...

    @property
    def state(self) -> State: ...

    @property
    def store(self) -> Store: ...

    @property
    def partition(self) -> int:
        """The physical log partition this replica applies (docs/design.md §16)."""
        ...

    @property
    def applied_event(self) -> asyncio.Event:
        """Set after every applied batch."""
        ...

    @property
    def apply_lock(self) -> asyncio.Lock:
        """Held while a log batch is applied and stored: state == store outside it."""
        ...

    async def install(self, applied: int, snapshot: list[Any]) -> None:
        """Make a member's captured state (at log offset ``applied``) this broker's."""
        ...

    def commit_update(self, batch: Batch) -> None:
        """Write update messages (the caller holds the apply lock)."""
        ...

    def set_join_progress(self, text: str) -> None:
        """Show the update's progress to operators."""
        ...

    @property
    def tls(self) -> ssl.SSLContext | None:
        """How to connect to a member (TLS when the cluster uses it), None: plaintext."""
        ...

    def update_finished(self, progress: "Progress") -> None:
        """The update is taken in: every queue is served here now."""
        ...


# --- the member's side ---------------------------------------------------------------


@dataclass(slots=True)
class _QueuePlan:
    name: str
    qid: int
    fresh: range  # never-delivered positions at the capture, descending
    below: list[int]  # acquired and released ones, descending
    may_move: bool  # has a dead-letter queue: its messages may move on

    @property
    def count(self) -> int:
        return len(self.fresh) + len(self.below)


@dataclass(slots=True)
class Capture:
    """A member's state at one batch boundary, held while an update streams."""

    applied: int
    snapshot: list[Any] | None
    plans: list[_QueuePlan]
    reader: StoreReader
    node: Donor

    def close(self) -> None:
        self.reader.close()
        self.node.holds.discard(self.applied)


async def wait_applied(node: Donor, since: int, timeout: float = 30.0) -> None:
    """Wait until ``node`` has applied log offset ``since`` and is healthy.

    Raises:
        Timeout: not within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while node.state.applied < since or not node.healthy:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout(
                f"this broker has applied the log to {node.state.applied}, not yet {since};"
                " ask another member"
            )
        try:
            await asyncio.wait_for(node.applied_event.wait(), min(left, 0.5))
        except TimeoutError:
            pass


async def capture(
    node: Donor, since: int, queues: list[str] | None, with_state: bool, timeout: float = 30.0
) -> Capture:
    """Capture ``node``'s state for an update, once it has applied offset ``since``.

    Raises:
        Timeout: this broker did not apply ``since`` within ``timeout`` seconds.
        JoinFailed: this broker is itself still taking in an update.
        InvalidArgument: a bad request.
    """
    if queues is not None and (
        not isinstance(queues, list) or not all(isinstance(q, str) for q in queues)
    ):
        raise InvalidArgument("UpdateRequest.queues must be a list of queue names or nil")
    if node.catchup is not None:
        # Its own store is not complete yet: it must not hand out what it lacks.
        raise JoinFailed("this broker is still joining itself; ask another member")
    await wait_applied(node, since, timeout)
    async with node.apply_lock:  # between two applied batches: state == store
        state = node.state
        names = sorted(state.queues) if queues is None else sorted(set(queues))
        plans = []
        for name in names:
            q = state.queues.get(name)
            if q is None:
                continue  # deleted meanwhile: the joiner's index knows
            fresh, below = q.live_desc()
            plans.append(_QueuePlan(name, q.qid, fresh, below, q.dead_letter is not None))
        fw = state.forwards
        if fw.in_flight and (queues is None or OUTBOX_NAME in queues):
            # Dead letters in flight to other partitions (cluster/forwarding.py): their
            # bodies are in the outbox until forwarded; "may move": sent as captured.
            boxed = sorted(set(fw.unrouted) | set(fw.refs), reverse=True)
            plans.append(_QueuePlan(OUTBOX_NAME, OUTBOX_QID, range(0), boxed, True))
        snap = state.full_snapshot() if with_state else None
        cap = Capture(state.applied, snap, plans, node.store.reader(), node)
        node.holds.add(cap.applied)
    return cap


async def update_frames(
    cap: Capture, corr: int, *, live: Callable[[str], QueueState | None]
) -> AsyncIterator[wire.Frame]:
    """The frames of an update after UpdateState: per queue UpdateQueue, UpdateFront
    chunks back to front, UpdateDone. ``live`` looks a queue up in the member's
    current state: a message no longer there, of a queue without a dead-letter queue,
    was dequeued since the capture and is skipped (the joiner would drop it)."""
    for plan in cap.plans:
        yield wire.UpdateQueue(corr, plan.name, plan.qid, plan.count)
        entries: list[list[Any]] = []
        size = 0
        returned: set[int] | None = None  # the queue's released positions, per chunk
        for positions in (plan.fresh, plan.below):
            for pos in positions:
                if not plan.may_move:
                    now = live(plan.name)
                    if now is None or now.qid != plan.qid:
                        break  # the queue was deleted: nothing of it is needed
                    if pos < now.cursor:
                        if returned is None:
                            returned = now.ready_set()
                        if not now.holds(pos, returned):
                            continue
                raw = cap.reader.get_raw(plan.qid, pos)
                if raw is None:
                    continue  # only if this store lost it; the joiner will ask again
                entries.append([pos, raw])
                size += len(raw) + 16
                if size >= CHUNK_BYTES or len(entries) >= CHUNK_COUNT:
                    yield wire.UpdateFront(corr, plan.qid, entries)
                    entries, size, returned = [], 0, None  # the queue moved on meanwhile
        if entries:
            yield wire.UpdateFront(corr, plan.qid, entries)
        yield wire.UpdateDone(corr, plan.name, plan.qid)


# --- the joiner's side ----------------------------------------------------------------


async def find_donors(
    log_: Log, start: int, node_id: str, wait: float, runtime: str = ""
) -> list[str]:
    """Addresses of live brokers that can serve an update, from the heartbeats on the
    log from ``start`` on.

    Only a runtime whose heartbeats say it serves (``Heartbeat.serving``: its client port
    answers and it is not taking in an update itself) is a donor: a broker still starting
    (an observer waiting for a voter, a member replaying the log) would refuse the
    connection, and the joiner would wait for it instead of forming the cluster.

    Reads for up to ``wait`` seconds; returns as soon as a second round of heartbeats
    shows who is alive (the first address seen first). Empty: nobody that serves is
    beating.

    Raises:
        JoinFailed: another runtime of this ``node_id`` (not ``runtime``) beats twice:
            a running broker has this node id, and this one would only be refused from
            the view after its whole update (a restarted broker's old runtime no longer
            beats; one on the same data dir cannot start at all).
    """
    found: dict[str, str] = {}  # runtime key -> address, in the order seen
    beats: dict[str, int] = {}
    twins: dict[str, int] = {}  # other runtimes of this node id -> heartbeats seen
    deadline = time.monotonic() + wait
    reader = log_.read(start)
    try:
        while time.monotonic() < deadline:
            try:
                records = await asyncio.wait_for(
                    reader.__anext__(), max(0.01, deadline - time.monotonic())
                )
            except TimeoutError:
                break
            for _, record in records:
                try:
                    origin, event = decode(record)
                except (MalformedEvent, UnreadableRecord):
                    continue  # only heartbeats matter here; the applier judges the rest
                if not isinstance(event, Heartbeat):
                    continue
                if origin.node == node_id:
                    if origin.runtime != runtime:
                        twins[origin.runtime] = twins.get(origin.runtime, 0) + 1
                        if twins[origin.runtime] >= 2:
                            raise JoinFailed(
                                f"node id {node_id!r} is in use by a running broker (runtime"
                                f" {origin.runtime}"
                                + (f" at {event.address}" if event.address else "")
                                + "): give this broker another --node-id"
                            )
                    continue
                if not event.serving or not event.address:
                    continue
                key = f"{origin.node}/{origin.runtime}"
                found.setdefault(key, event.address)
                beats[key] = beats.get(key, 0) + 1
            # (A runtime of this node id seen once is waited for: a second beat proves
            # a running twin, refused above; a dying one goes quiet.)
            if found and max(beats.values()) >= 2 and all(n >= 2 for n in twins.values()):
                break
    finally:
        await reader.aclose()
    return list(found.values())


class _Link(MemberLink):
    """A connection to a member for one update request, as a proven member."""

    what = "update"
    client = "baton-join"
    proof = b""  # the signed challenge of this connection's member
    # Whether the member listed its feature flags in HelloOk (a build with flags): only
    # such a member reads an UpdateRequest that lists this build's.
    flags = False

    @classmethod
    async def connect(cls, address: str, node: Joiner, timeout: float = 5.0) -> "_Link":
        """Connect to the member at ``address`` and take its challenge (Hello MEMBER,
        cluster/member_link.py).

        Raises:
            JoinFailed: no connection, or the member refused it or sent no challenge.
        """
        link = await cls.open(
            address, node.key, node.tls, max_frame=MAX_UPDATE_FRAME, error=JoinFailed,
            timeout=timeout,
        )
        assert link.hello is not None
        link.proof = node.join_key.prove(link.nonce, link.node_id)
        link.flags = isinstance(link.hello.auth.get("features"), list)
        return link

    def request(
        self, corr: int, since: int, queues: list[str] | None, state: bool, partition: int = 0
    ) -> None:
        """Send the UpdateRequest, with this connection's member proof."""
        if partition:
            self.send(wire.UpdateRequest(
                corr, since, queues, state, self.member, self.proof, sorted(FEATURES), partition
            ))
        elif self.flags:
            self.send(wire.UpdateRequest(
                corr, since, queues, state, self.member, self.proof, sorted(FEATURES)
            ))
        else:
            self.send(wire.UpdateRequest(corr, since, queues, state, self.member, self.proof))

    async def next(self, timeout: float | None = None) -> wire.Frame:
        frame = await super().next(timeout)
        if isinstance(frame, wire.Error):
            raise wire_error(self.address, frame)
        return frame


def wire_error(address: str, frame: wire.Error) -> BatonError:
    return JoinFailed(f"{address} failed the update: {frame.message} (code {frame.code})")


@dataclass(slots=True)
class Progress:
    queues: int = 0
    queues_done: int = 0
    messages: dict[str, int] = field(default_factory=dict)  # expected per queue
    received: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def text(self) -> str:
        total = sum(self.messages.values())
        got = sum(self.received.values())
        return f"{self.queues_done}/{self.queues} queues, {got}/{total} messages"


class Catchup:
    """The joiner's side of an update: installs the index, takes in the messages,
    tracks what is locked, and fails over to another member if the donor dies."""

    def __init__(self, node: Joiner) -> None:
        self.node = node
        self.pending: dict[str, int] = {}  # queue -> qid whose messages are not all here
        # Dead-lettered before their body arrived: src -> {dst: (headers, enqueued_at)}
        self.waiting: dict[
            MessageKey, dict[MessageKey, tuple[dict[str, Any], int, dict[str, Any] | None]]
        ] = {}
        self.dst_pending: dict[MessageKey, MessageKey] = {}  # dst -> src
        self._dst_count: dict[int, int] = {}  # qid -> pending dsts in it
        self.progress = Progress()
        self.failed: list[str] = []
        self.done = asyncio.Event()
        self.on_unlocked: Callable[[str], None] | None = None
        self._link: _Link | None = None
        self._corr = 0
        self._last_report = 0.0

    # -- locking ---------------------------------------------------------------------

    def locked(self, queue: str) -> bool:
        if queue in self.pending:
            return True
        q = self.node.state.queues.get(queue)
        return q is not None and self._dst_count.get(q.qid, 0) > 0

    def _maybe_unlocked(self, queue: str) -> None:
        if queue == OUTBOX_NAME:
            return  # (no queue: nothing to unlock)
        if not self.locked(queue) and self.on_unlocked is not None:
            self.on_unlocked(queue)

    # -- the first request -------------------------------------------------------------

    async def begin(self, donors: list[str], since: int) -> None:
        """Get the index from the first donor that answers; install it.

        Raises:
            JoinFailed: no donor gave an update.
        """
        errors = []
        for address in donors:
            try:
                link = await _Link.connect(address, self.node)
                self._corr += 1
                link.request(self._corr, since, None, True, self.node.partition)
                # The member may first have to apply up to our Join: seconds at most.
                frame = await link.next(35)
                if not isinstance(frame, wire.UpdateState) or frame.snapshot is None:
                    link.close()
                    raise JoinFailed(f"{address} sent {type(frame).__name__}, not UpdateState")
            except BatonError as exc:
                log.warning("join: no update from %s: %s", address, exc)
                errors.append(f"{address}: {exc}")
                self.failed.append(address)
                continue
            await self.node.install(frame.applied, frame.snapshot)
            self.pending = {q.name: q.qid for q in self.node.state.queues.values()}
            if self.node.state.forwards.in_flight:
                self.pending[OUTBOX_NAME] = OUTBOX_QID  # (dead letters in flight)
            self.progress.queues = len(self.pending)
            self.progress.messages = {q.name: q.length for q in self.node.state.queues.values()}
            self._link = link
            log.info(
                "join: index from %s at log offset %d: %d queues to update",
                address, frame.applied, len(self.pending),
            )
            return
        raise JoinFailed("no member could update this broker: " + "; ".join(errors))

    async def run(self) -> None:
        """Take in every queue's messages, failing over to other members; returns
        when nothing is locked any more."""
        link, self._link = self._link, None
        while True:
            if link is not None:
                try:
                    await self._stream(link, self._corr)
                except BatonError as exc:
                    log.warning("join: update from %s broke off: %s", link.address, exc)
                    self.failed.append(link.address)
                finally:
                    link.close()
                link = None
            if not self.pending and not self.dst_pending:
                break
            link = await self._retry()
        self.node.update_finished(self.progress)
        self.done.set()

    async def _retry(self) -> _Link:
        """Ask another member for what is still missing (back-off while none answers)."""
        delay = 0.2
        while True:
            ms = self.node.state.membership
            if ms.join_keys.get(self.node.key) != self.node.join_key.public:
                # The view dropped this runtime meanwhile, and forgot its key: no member
                # would serve it. Its Join goes on the log again first.
                try:
                    await self.node.rejoin()
                    log.info("join: this runtime's Join is on the log again, with its key")
                except BatonError as exc:
                    log.warning("join: cannot append this runtime's Join again: %s", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
            addresses = [
                ms.known[k].address
                for k in ms.members
                if k != self.node.key and k in ms.known and ms.known[k].address
            ]
            # Members not failed yet first, then the others again.
            addresses.sort(key=lambda a: self.failed.count(a))
            want = set(self.pending)
            for dst in self.dst_pending:
                name = self._name(dst[0])
                if name is not None:
                    want.add(name)
            for address in addresses:
                try:
                    link = await _Link.connect(address, self.node)
                except BatonError as exc:
                    log.warning("join: %s", exc)
                    self.failed.append(address)
                    continue
                self._corr += 1
                link.request(
                    self._corr, self.node.state.applied, sorted(want), False, self.node.partition
                )
                log.info("join: asking %s for %d queues not done", address, len(want))
                return link
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _name(self, qid: int) -> str | None:
        if qid == OUTBOX_QID:
            return OUTBOX_NAME
        for name, q in self.node.state.queues.items():
            if q.qid == qid:
                return name
        return None

    async def _stream(self, link: _Link, corr: int) -> None:
        node = self.node
        ready_at = node.state.applied
        while True:
            frame = await link.next(20)  # a paused or dead member: ask another one
            match frame:
                case wire.UpdateState():
                    ready_at = frame.applied
                case wire.UpdateQueue():
                    self.progress.messages[frame.queue] = frame.count
                    self.progress.received[frame.queue] = 0
                case wire.UpdateFront():
                    # Only once this replica has applied as far as the capture: then "is
                    # it still in my index" is the question that decides (module docstring).
                    while node.state.applied < ready_at:
                        await node.applied_event.wait()
                    async with node.apply_lock:
                        self._take(frame.qid, frame.entries)
                    await asyncio.sleep(0)  # let the apply loop and clients in between chunks
                case wire.UpdateDone():
                    if self.pending.get(frame.queue) == frame.qid:
                        del self.pending[frame.queue]
                        self.progress.queues_done += 1
                        self._maybe_unlocked(frame.queue)
                    self._report()
                case wire.Ok():
                    return
                case _:
                    raise JoinFailed(f"unexpected {type(frame).__name__} in an update")

    def _take(self, qid: int, entries: list[Any]) -> None:
        """Write the messages this replica's index still holds (under the apply lock)."""
        node = self.node
        name = self._name(qid)
        q = node.state.queues.get(name) if name is not None else None
        returned = q.ready_set() if q is not None else None
        batch = node.store.batch()
        n = 0
        for item in entries:
            if not (isinstance(item, list) and len(item) == 2 and type(item[0]) is int
                    and isinstance(item[1], bytes)):
                raise JoinFailed("malformed UpdateFront entry")
            pos, raw = item
            n += 1
            if (q.holds(pos, returned) if q is not None else self._boxed(qid, pos)):
                batch.put_raw(qid, pos, raw)
                self._arrived((qid, pos))
            self._resolve((qid, pos), raw, batch)
        node.commit_update(batch)
        if name is not None:
            self.progress.received[name] = self.progress.received.get(name, 0) + n
        self._report()

    def _resolve(self, src: MessageKey, raw: bytes, batch: Batch) -> None:
        """``src`` arrived: write it wherever the log dead-lettered it meanwhile."""
        for dst, (headers, enqueued_at, defaults) in self.waiting.pop(src, {}).items():
            moved = merge_headers(raw, headers, enqueued_at, defaults)
            name = self._name(dst[0])
            q = self.node.state.queues.get(name) if name is not None else None
            if q.holds(dst[1]) if q is not None else self._boxed(dst[0], dst[1]):
                batch.put_raw(dst[0], dst[1], moved)
            self._arrived(dst)
            self._resolve(dst, moved, batch)  # moved on again since

    def _boxed(self, qid: int, pos: int) -> bool:
        """A dead letter in flight whose body the outbox still needs."""
        return qid == OUTBOX_QID and self.node.state.forwards.in_outbox(pos)

    def _arrived(self, key: MessageKey) -> None:
        if self.dst_pending.pop(key, None) is not None:
            self._dst_count[key[0]] -= 1
            if not self._dst_count[key[0]]:
                del self._dst_count[key[0]]
                name = self._name(key[0])
                if name is not None:
                    self._maybe_unlocked(name)

    # -- hooks from the node's apply loop (under the apply lock) --------------------------

    def missed_move(
        self, src: MessageKey, dst: MessageKey, headers: dict[str, Any], at: int,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        """The log dead-lettered ``src`` before its body arrived here."""
        self.waiting.setdefault(src, {})[dst] = (headers, at, defaults)
        if dst not in self.dst_pending:
            self.dst_pending[dst] = src
            self._dst_count[dst[0]] = self._dst_count.get(dst[0], 0) + 1
        self._arrived(src)  # src is gone from its queue: no longer needed there

    def removed(self, qid: int, positions: list[int] | range | None) -> None:
        """Messages left their queue (None: the whole queue was deleted)."""
        if positions is None:
            # Deleted: nothing of it is awaited any more (a queue declared again under
            # the name has a new id, and every message of it comes from the log).
            for name in [n for n, q in self.pending.items() if q == qid]:
                del self.pending[name]
                self.progress.queues_done += 1
        if not self.dst_pending:
            return
        for key in [k for k in self.dst_pending if k[0] == qid]:
            if positions is None or key[1] in positions:
                self._arrived(key)

    def _report(self) -> None:
        now = time.monotonic()
        if now - self._last_report < 2.0:
            return
        self._last_report = now
        text = self.progress.text()
        self.node.set_join_progress(text)
        log.info("join: %s", text)
