"""The replica driver: the I/O edge around the pure :class:`cluster.state.State`.

A :class:`Node` does three things, and nothing else:

* **append** — :meth:`Node.submit` stamps an event with this process's origin
  (node id, runtime id, next sequence number, wall-clock ms) and queues it; one
  appender task writes whatever has queued up as one log batch (group commit), so
  one round trip to the log carries many events and origin sequences reach the
  log in order.
* **apply** — one reader task tails the log from the applied offset, applies each
  record to the state, writes the batch's effects and snapshots to the store in
  one write batch together with the batch's last offset, then hands the effects to
  the listener (the broker).
* **complete** — a submitted event's future resolves with its result when the
  event is *both* durable on the log (its append returned) and applied here. That
  is the moment a command takes effect (DESIGN §5).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from clients.errors import (
    BatonError,
    LogTruncated,
    LogUnavailable,
    MessageTooLarge,
    InvalidArgument,
    ShuttingDown,
    Timeout,
    StoreError,
)
from cluster.codec import EventEncoder, MalformedEvent, decode
from cluster.events import Enqueue, Event, Heartbeat, Leave, Origin, Propose, Vote
from cluster.log import Log
from cluster.state import (
    Completed,
    Effect,
    Moved,
    QueueGone,
    QueueState,
    Removed,
    RemovedRange,
    State,
    Stored,
)
from store import Store

__all__ = ["Node"]

log = logging.getLogger("baton.node")

EffectListener = Callable[[list[Effect]], None]

#: Bytes a log backend may add per record, counted when cutting appends to size.
_RECORD_OVERHEAD = 64


class Node:
    """One broker's replica of the cluster state.

    Args:
        node_id: this broker's persistent id.
        log: the ordered log (shared by every replica).
        store: this broker's local store.
        clock: wall-clock milliseconds (injectable for tests).
        max_append: most events per log append.
        max_outbox: most events waiting for the log (while it is unavailable);
            beyond it commands fail with LogUnavailable at once.
        role: "voter" or "observer" (DESIGN §7).
        properties: instance properties published with heartbeats (e.g. a zone).
        heartbeat_ms: interval between heartbeats; suspicion comes after
            ``suspect_beats`` of another member's beats (observers: 3x).
    """

    def __init__(
        self,
        node_id: str,
        log: Log,
        store: Store,
        *,
        clock: Callable[[], int] | None = None,
        max_append: int = 2048,
        max_outbox: int = 200_000,
        role: str = "voter",
        properties: dict[str, Any] | None = None,
        heartbeat_ms: int = 500,
        suspect_beats: int = 6,
    ) -> None:
        self.node_id = node_id
        self.runtime_id = uuid.uuid4().hex[:12]
        self.key = f"{node_id}/{self.runtime_id}"  # this runtime's member key
        self.role = role
        self.properties = dict(properties or {})
        self.address = ""
        self.heartbeat_ms = heartbeat_ms
        self.joined = asyncio.Event()  # set while this runtime is in the established view
        self.refused: str | None = None
        self._proposed: tuple[int, tuple[str, ...]] | None = None
        self._voted: tuple[int, tuple[str, ...]] | None = None
        self.log = log
        self.store = store
        self.state = State(suspect_beats)
        self.listener: EffectListener | None = None
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._max_append = max_append
        self._encoder = EventEncoder()
        self._seq = 0
        # (seq, record, keep): events not on the log yet, in seq order; "keep" ones
        # (publishes) are also in the store's outbox while their append is pending.
        self._outbox: list[tuple[int, bytes, bool]] = []
        self._max_outbox = max_outbox
        self._append_error: str | None = None  # why the last append failed, until one works
        self._leftover: list[tuple[str, int, bytes]] = []
        self._keys_forgotten = 0  # publish keys below this seq are deleted from the store
        self._outbox_ready = asyncio.Event()
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._durable_seq = 0  # every own seq <= this is durable on the log
        self._stashed: dict[int, Completed] = {}  # applied before their append returned
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.applied_event = asyncio.Event()  # set after every applied batch (tests, tools)
        self.healthy = True

    # -- lifecycle -----------------------------------------------------------------

    async def start(self, address: str = "", timeout: float = 60.0) -> None:
        """Load the store, start appending and applying, heartbeat, and join.

        Returns once this runtime is a member of the established view: the state
        has caught up with the log, and what earlier runtimes of this node held was
        released when the view dropped them.

        Raises:
            InvalidArgument: another running broker uses this node id.
            Timeout: not a member within ``timeout`` seconds.
            LogTruncated: the store does not fit the log.
        """
        self.address = address
        loaded = self.store.load()
        self._leftover = self.store.outbox_load()
        end = await self.log.end_offset()
        if loaded.applied >= end:
            raise LogTruncated(
                f"this broker's store has applied {self.log.url} up to offset {loaded.applied},"
                f" but that log ends at {end}: it is not the log this data dir was built"
                " from (wrong --log URL, or the log was reset); use the right log or a new"
                " data dir"
            )
        if loaded.applied + 1 < await self.log.start_offset():
            raise LogTruncated(
                f"the log was truncated past this broker's applied offset {loaded.applied};"
                " start it with a new data dir"
            )
        if loaded.meta is not None:
            self.state.restore_meta(loaded.meta)
            self.state.restore_keys(loaded.keys)
            self._keys_forgotten = loaded.keys[0][0] if loaded.keys else 0
        for name, snap in loaded.queues.items():
            self.state.queues[name] = QueueState.restore(snap)
        self.state.applied = loaded.applied
        log.info(
            "node %s runtime %s: %d queues, resuming after log offset %d",
            self.node_id,
            self.runtime_id,
            len(self.state.queues),
            loaded.applied,
        )
        self._tasks = [
            asyncio.create_task(self._append_loop(), name="baton-append"),
            asyncio.create_task(self._apply_loop(), name="baton-apply"),
            asyncio.create_task(self._heartbeat_loop(), name="baton-heartbeat"),
        ]
        try:
            async with asyncio.timeout(timeout):
                await self.joined.wait()
        except TimeoutError:
            raise Timeout(f"not admitted to the cluster's view within {timeout:.0f}s") from None
        if self.refused is not None:
            raise InvalidArgument(self.refused)
        self._resubmit_leftover()
        log.info(
            "node %s joined view %d of cluster %s as %s",
            self.key,
            self.state.membership.view_seq,
            self.state.membership.cluster_id,
            self.role,
        )

    async def leave(self) -> None:
        """Tell the cluster this runtime leaves (clean shutdown): no suspicion wait."""
        if self.joined.is_set() and not self._closing:
            try:
                await asyncio.wait_for(self.submit(Leave()), 2)
            except (BatonError, TimeoutError):
                pass

    async def _heartbeat_loop(self) -> None:
        beat: asyncio.Future[dict[str, Any]] | None = None
        while True:
            if beat is None or beat.done():  # no pile of beats while the log is down
                beat = self.submit(Heartbeat(self.role, self.address, self.properties))
                beat.add_done_callback(_ignore_outcome)
            await asyncio.sleep(self.heartbeat_ms / 1000)

    def _membership_duties(self) -> None:
        """After each applied batch: propose, vote, and track our own membership."""
        ms = self.state.membership
        me = self.key
        if me in ms.refused:
            self.refused = ms.refused[me]
            self.joined.set()  # wakes start(), which raises
            return
        if ms.is_member(me):
            self.joined.set()
        else:
            self.joined.clear()
        if self.role == "voter" and ms.proposer() == me and ms.needs_view():
            wanted = (ms.view_seq + 1, tuple(ms.desired()))
            if wanted != self._proposed and (
                ms.proposal is None or any(ms.suspected(v) for v in ms.voters_pending())
                or tuple(ms.proposal.members) != wanted[1]
            ):
                self._proposed = wanted
                cluster_id = ms.cluster_id or uuid.uuid4().hex[:16]
                self.submit(Propose(wanted[0], wanted[1], cluster_id)).add_done_callback(
                    _ignore_outcome
                )
        p = ms.proposal
        if p is not None and me in ms.voters_pending():
            ballot = (p.seq, tuple(p.members))
            if ballot != self._voted:
                self._voted = ballot
                self.submit(Vote(p.seq, True)).add_done_callback(_ignore_outcome)

    async def stop(self) -> None:
        """Finish pending appends, stop the tasks. Pending commands fail with ShuttingDown."""
        self._closing = True
        deadline = time.monotonic() + 5
        while self._outbox and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ShuttingDown("the broker is shutting down"))
        self._waiting.clear()

    # -- appending -----------------------------------------------------------------

    def submit(self, event: Event) -> asyncio.Future[dict[str, Any]]:
        """Append ``event``; the future resolves with its result once durable and applied.

        The future fails with the event's BatonError (e.g. QueueNotFound) if
        applying it failed; while the log cannot be written the event waits in the
        outbox and its append is retried (a publish is also kept in the store, so a
        broker that dies meanwhile appends it at its next start). It fails with
        LogUnavailable only when the outbox is full.
        """
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if self._closing:
            fut.set_exception(ShuttingDown("the broker is shutting down"))
            return fut
        if len(self._outbox) >= self._max_outbox:
            fut.set_exception(
                LogUnavailable(
                    f"{len(self._outbox)} events wait for the log {self.log.url}, which cannot"
                    f" be written now ({self._append_error or 'too slow'}); try again later"
                )
            )
            return fut
        self._seq += 1
        seq = self._seq
        record = self._encoder.encode(
            Origin(self.node_id, self.runtime_id, seq, self._clock()), event
        )
        if len(record) > self.log.max_record:
            # Refused alone, so it cannot fail the other events of its append.
            fut.set_exception(
                MessageTooLarge(
                    f"event of {len(record)} bytes is above the log's record limit of "
                    f"{self.log.max_record}; publish smaller batches"
                )
            )
            return fut
        self._outbox.append((seq, record, type(event) is Enqueue))
        self._waiting[seq] = fut
        self._outbox_ready.set()
        return fut

    def _take_batch(self) -> list[tuple[int, bytes, bool]]:
        """The next append: at most ``max_append`` events and the log's batch bytes."""
        room = self.log.max_append_bytes
        n = 0
        for _, record, _ in self._outbox[: self._max_append]:
            room -= len(record) + _RECORD_OVERHEAD
            if room < 0 and n > 0:
                break
            n += 1
        batch = self._outbox[:n]
        del self._outbox[:n]
        return batch

    async def _append_loop(self) -> None:
        while True:
            await self._outbox_ready.wait()
            batch = self._take_batch()
            if not self._outbox:
                self._outbox_ready.clear()
            if not batch:
                continue
            kept = self._keep([(seq, r) for seq, r, keep in batch if keep])
            records = [r for _, r, _ in batch]
            appended = await self._append_retrying(records, batch)
            if kept:  # on the log now, or refused for good (the client got the error)
                self._unkeep(self.runtime_id, kept)
            if not appended:
                continue
            self._durable_seq = batch[-1][0]
            for seq, _, _ in batch:
                done = self._stashed.pop(seq, None)
                if done is not None:
                    self._complete(done)

    async def _append_retrying(self, records: list[bytes], batch: list[tuple[int, bytes, bool]]) -> bool:
        """Append, retrying with back-off while the log is unavailable. Returns False
        if the batch was refused for good (its futures failed)."""
        delay = 0.05
        while True:
            try:
                await self.log.append(records)
            except LogUnavailable as exc:
                # Kafka down, disk full: the events wait in order; appliers drop the
                # duplicates a retry of an append with an unknown outcome may make.
                if self._append_error is None:
                    log.error("cannot append to the log, retrying: %s", exc)
                self._append_error = str(exc)
                self.healthy = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            except BatonError as exc:
                self._fail_batch(batch, exc)
                return False
            except Exception as exc:  # a backend bug must not kill the appender
                log.exception("log append failed")
                self._fail_batch(batch, LogUnavailable(f"log append failed: {exc}"))
                return False
            if self._append_error is not None:
                log.warning("appending to the log works again")
                self._append_error = None
            return True

    def _keep(self, records: list[tuple[int, bytes]]) -> list[int]:
        """Put publishes in the store's outbox before their append; returns their seqs."""
        if not records:
            return []
        try:
            self.store.outbox_put(self.runtime_id, records)
        except StoreError as exc:  # the log may still work: go on, without the net
            log.warning("cannot keep %d publishes in the store's outbox: %s", len(records), exc)
            return []
        return [seq for seq, _ in records]

    def _unkeep(self, runtime: str, seqs: list[int]) -> None:
        try:
            self.store.outbox_remove(runtime, seqs)
        except StoreError as exc:  # appended twice at the next start: dropped as duplicates
            log.warning("cannot clear %d outbox entries: %s", len(seqs), exc)

    def _resubmit_leftover(self) -> None:
        """Publish again what an earlier run of this node kept but may not have got onto
        the log (it died first). That run's events are fenced now, so they go out as
        this runtime's; the publish's idempotency key stops a second enqueue if the
        earlier append did land (or the client retried it elsewhere)."""
        if not self._leftover:
            return
        by_runtime: dict[str, list[int]] = {}
        again = 0
        for runtime, seq, record in self._leftover:
            by_runtime.setdefault(runtime, []).append(seq)
            try:
                _, event = decode(record)
            except MalformedEvent as exc:
                log.warning("outbox entry %s/%d unreadable, dropped: %s", runtime, seq, exc)
                continue
            if type(event) is Enqueue:
                self.submit(event).add_done_callback(_ignore_outcome)
                again += 1
        log.info("publishing again %d publishes kept by an earlier run of this node", again)
        for runtime, seqs in by_runtime.items():
            self._unkeep(runtime, seqs)
        self._leftover = []

    def _fail_batch(self, batch: list[tuple[int, bytes, bool]], exc: BatonError) -> None:
        log.warning("append of %d events failed: %s", len(batch), exc)
        for seq, _, _ in batch:
            fut = self._waiting.pop(seq, None)
            if fut is not None and not fut.done():
                fut.set_exception(exc)

    # -- applying ------------------------------------------------------------------

    async def _apply_loop(self) -> None:
        """Apply the log forever. A failing read (corrupt record, log unreachable) is
        logged loudly and retried from the applied offset: the broker stays up, its
        commands wait, and ``healthy`` is False until applying works again."""
        delay = 0.5
        while True:
            try:
                await self._apply_from(self.state.applied + 1)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.healthy = False
                log.critical(
                    "cannot read the log after offset %d (retrying in %.1fs): %s",
                    self.state.applied,
                    delay,
                    exc,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _apply_from(self, start: int) -> None:
        state = self.state
        async for records in self.log.read(start):
            out: list[Effect] = []
            for offset, record in records:
                try:
                    origin, event = decode(record)
                except MalformedEvent as exc:
                    log.warning("log offset %d: malformed record ignored: %s", offset, exc)
                    state.skip_malformed(offset)
                    continue
                state.apply(offset, origin, event, out)
            await self._persist(out, records[-1][0])
            self.healthy = True
            self._dispatch(out)
            self._membership_duties()
            self.applied_event.set()
            self.applied_event.clear()

    async def _persist(self, effects: list[Effect], offset: int) -> None:
        """Write the batch's effects and snapshots atomically with ``offset``.

        A failing store (disk full) stalls applying — retried with back-off — but
        never crashes the broker or skips a batch.
        """
        meta, queues = self.state.take_dirty()
        keys, forget_below = self.state.take_keys()
        forget = range(self._keys_forgotten, forget_below)
        delay = 0.1
        while True:
            batch = self.store.batch()
            for e in effects:
                t = type(e)
                if t is Stored:
                    assert isinstance(e, Stored)
                    batch.put_messages(e.qid, e.first, e.messages, e.enqueued_at, e.publish_time)
                elif t is Removed:
                    assert isinstance(e, Removed)
                    batch.remove(e.qid, e.positions)
                elif t is RemovedRange:
                    assert isinstance(e, RemovedRange)
                    batch.remove_range(e.qid, e.lo, e.hi)
                elif t is Moved:
                    assert isinstance(e, Moved)
                    batch.move(e.src_qid, e.src_pos, e.dst_qid, e.dst_pos, e.headers, e.enqueued_at)
                elif t is QueueGone:
                    assert isinstance(e, QueueGone)
                    batch.drop_queue(e.qid)
            for name, snap in queues.items():
                batch.put_queue(name, snap)
            if meta is not None:
                batch.put_meta(meta)
            if keys or forget:
                batch.put_keys(keys, forget)
            try:
                self.store.commit(batch, offset)
            except StoreError as exc:
                if self.healthy:
                    log.error("store write failed, retrying (applying is stalled): %s", exc)
                self.healthy = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._keys_forgotten = forget_below
            if not self.healthy:
                log.warning("store writes work again")
            self.healthy = True
            return

    def _dispatch(self, effects: list[Effect]) -> None:
        node, runtime = self.node_id, self.runtime_id
        for e in effects:
            if type(e) is Completed and e.node == node and e.runtime == runtime:
                assert isinstance(e, Completed)
                if e.seq <= self._durable_seq:
                    self._complete(e)
                else:
                    self._stashed[e.seq] = e
        if self.listener is not None:
            try:
                self.listener(effects)
            except Exception:
                log.exception("effect listener failed")

    def _complete(self, done: Completed) -> None:
        fut = self._waiting.pop(done.seq, None)
        if fut is None or fut.done():
            return
        if done.error is not None:
            fut.set_exception(done.error)
        else:
            fut.set_result(done.result or {})


def _ignore_outcome(fut: asyncio.Future[dict[str, Any]]) -> None:
    """Background membership events: their failures show in the state, not here."""
    if not fut.cancelled():
        fut.exception()
