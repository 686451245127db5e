"""The replica driver: the I/O edge around the pure :class:`batonmq.cluster.state.State`.

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
from typing import Any, TypeVar

from batonmq.cluster.errors import (
    BatonError,
    JoinFailed,
    LogTruncated,
    LogUnavailable,
    MessageTooLarge,
    InvalidArgument,
    ShuttingDown,
    Timeout,
    StoreError,
)
from batonmq.cluster.codec import EventEncoder, MalformedEvent, decode
from batonmq.cluster.events import Checkpoint, Enqueue, Event, Heartbeat, Join, Leave, Origin, Propose, Vote
from batonmq.cluster.log import Log
from batonmq.cluster.results import Result
from batonmq.cluster.state import (
    CheckpointApplied,
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
from batonmq.cluster.update import Catchup, Progress, find_donors
from batonmq.store import Batch, Loaded, Store

__all__ = ["Node"]

log = logging.getLogger("baton.node")

#: What a submitted event answers (its class names it: cluster/events.py).
R = TypeVar("R", bound="Result | None")

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
        checkpoint_ms: how often the leader appends a checkpoint (digest check,
            log truncation); 0: never.
        join: how a broker with an empty store starts on a non-empty log:
            "auto" (an update from a live member, DESIGN §8; replay the log from
            offset 0 if no member is alive and the log was never truncated),
            "update" (only an update), or "replay" (always replay the log).
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
        checkpoint_ms: int = 5000,
        join: str = "auto",
    ) -> None:
        if join not in ("auto", "update", "replay"):
            raise InvalidArgument("join must be 'auto', 'update' or 'replay'")
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
        self._outbox_failures = 0  # publish batches the store's outbox refused in a row
        self._keys_forgotten = 0  # publish keys below this seq are deleted from the store
        self._outbox_ready = asyncio.Event()
        # seq -> the future submit() returned: each of its event's result type.
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._durable_seq = 0  # every own seq <= this is durable on the log
        self._stashed: dict[int, Completed] = {}  # applied before their append returned
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.applied_event = asyncio.Event()  # set after every applied batch (tests, tools)
        self.healthy = True
        # Held while a log batch is applied and stored: state == store outside it.
        self.apply_lock = asyncio.Lock()
        self.holds: set[int] = set()  # capture offsets of updates this broker serves
        self.join_mode = join
        self.catchup: Catchup | None = None  # while this broker takes in an update
        self.join_report: dict[str, Any] | None = None
        self.on_unlocked: Callable[[str], None] | None = None
        self.on_truncated: Callable[[], None] | None = None  # the broker restarts us
        self.checkpoint_ms = checkpoint_ms
        self.last_checkpoint: dict[str, Any] | None = None
        self.digest_mismatches = 0
        self.truncated_before = 0  # the log's start offset after our last truncation
        self._truncate_asked = 0

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
        first = await self.log.start_offset()
        have = loaded.meta is not None or loaded.applied >= 0
        if have and loaded.applied >= end:
            raise LogTruncated(
                f"this broker's store has applied {self.log.url} up to offset {loaded.applied},"
                f" but that log ends at {end}: it is not the log this data dir was built"
                " from (wrong --log URL, or the log was reset); use the right log or a new"
                " data dir"
            )
        why = None
        if have and self.store.get_ident("update") == "incomplete":
            why = "its last join did not finish"
        elif have and loaded.applied + 1 < first:
            why = f"the log was truncated past its applied offset {loaded.applied} (it starts at {first})"
        if why is not None:
            # DESIGN §8: a broker whose offset is gone joins like a new one.
            log.warning("node %s starts again as a new broker: %s", self.node_id, why)
            self.store.reset()
            self.store.put_ident("update", "")  # set again if an update is installed
            loaded, have = Loaded(), False
        if loaded.meta is not None:
            self.state.restore_meta(loaded.meta)
            self.state.restore_keys(loaded.keys)
            self._keys_forgotten = loaded.keys[0][0] if loaded.keys else 0
        for name, snap in loaded.queues.items():
            self.state.queues[name] = QueueState.restore(snap)
        self.state.applied = loaded.applied
        if not have and end > first and self.join_mode != "replay":
            await self._join(first, timeout)
        elif not have and first > 0:
            raise LogTruncated(
                f"the log starts at offset {first}: a broker with an empty store cannot replay"
                " it; start it with join 'auto' or 'update' while a member is alive"
            )
        log.info(
            "node %s runtime %s: %d queues, resuming after log offset %d",
            self.node_id,
            self.runtime_id,
            len(self.state.queues),
            self.state.applied,
        )
        self._tasks = [
            asyncio.create_task(self._append_loop(), name="baton-append"),
            asyncio.create_task(self._apply_loop(), name="baton-apply"),
            asyncio.create_task(self._heartbeat_loop(), name="baton-heartbeat"),
            asyncio.create_task(self._checkpoint_loop(), name="baton-checkpoint"),
        ]
        if self.catchup is not None:
            self._tasks.append(asyncio.create_task(self.catchup.run(), name="baton-join"))
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

    # -- joining live (DESIGN §8, cluster/update.py) -----------------------------------

    async def _join(self, first: int, timeout: float) -> None:
        """Get the state from a live member instead of replaying the log.

        Raises:
            Timeout: no member gave an update within ``timeout`` seconds.
            LogUnavailable: the Join cannot be appended.
        """
        self._seq += 1
        record = self._encoder.encode(
            Origin(self.node_id, self.runtime_id, self._seq, self._clock()), Join(self.address)
        )
        at = await self.log.append([record])
        log.info("node %s: joining at log offset %d; looking for a live member", self.key, at)
        deadline = time.monotonic() + timeout
        wait = max(2.0, 4 * self.heartbeat_ms / 1000)
        while True:
            donors = await find_donors(self.log, at, self.node_id, wait)
            if not donors and self.join_mode == "auto" and first == 0:
                log.info("no live member: replaying the log from offset 0")
                return
            if donors:
                catchup = Catchup(self)
                catchup.on_unlocked = self._unlocked
                self.catchup = catchup
                try:
                    await catchup.begin(donors, at)
                    return
                except BatonError as exc:
                    self.catchup = None
                    log.warning("join: %s", exc)
            if time.monotonic() > deadline:
                raise Timeout(
                    f"no live member gave this broker the cluster's state within {timeout:.0f}s"
                    " (the log was truncated, so it cannot be replayed)"
                    if first > 0 else
                    f"no live member gave this broker the cluster's state within {timeout:.0f}s"
                )
            await asyncio.sleep(0.5)

    async def install(self, applied: int, snapshot: list[Any]) -> None:
        """Make a member's captured state (at log offset ``applied``) this broker's."""
        if not isinstance(snapshot, list) or len(snapshot) != 3:
            raise JoinFailed("malformed state snapshot in UpdateState")
        self.store.put_ident("update", "incomplete")
        try:
            self.state.install(snapshot)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise JoinFailed(f"malformed state snapshot in UpdateState: {exc!r}") from exc
        if self.state.applied != applied:
            raise JoinFailed(f"snapshot is at offset {self.state.applied}, not {applied}")
        # Keys below the snapshot's oldest were never in this store: nothing to delete.
        self._keys_forgotten = self.state.keys_floor()
        async with self.apply_lock:
            await self._persist([], applied)

    def locked(self, queue: str) -> bool:
        """Is ``queue`` still being updated here (no interest, no delivery)?"""
        c = self.catchup
        return c is not None and c.locked(queue)

    def _unlocked(self, queue: str) -> None:
        log.debug("join: queue %s is up to date here", queue)
        if self.on_unlocked is not None:
            try:
                self.on_unlocked(queue)
            except Exception:
                log.exception("unlock listener failed")

    def commit_update(self, batch: Batch) -> None:
        """Write update messages (caller holds the apply lock: state == store)."""
        self.store.commit(batch, self.state.applied)

    def set_join_progress(self, text: str) -> None:
        """Shown to operators in the topology (heartbeat properties) and the log."""
        self.properties["join"] = text

    def update_finished(self, progress: Progress) -> None:
        took = time.monotonic() - progress.started
        total = sum(progress.messages.values())
        self.join_report = {
            "queues": progress.queues,
            "messages": total,
            "received": sum(progress.received.values()),
            "seconds": round(took, 3),
        }
        try:
            self.store.put_ident("update", "")
        except StoreError as exc:  # next start rejoins as new: safe, only slower
            log.warning("cannot clear the update mark: %s", exc)
        self.properties.pop("join", None)
        self.catchup = None
        log.info(
            "join: done, %d queues and %d messages in %.1fs; every queue is served here",
            progress.queues, total, took,
        )
        for name in sorted(self.state.queues):
            self._unlocked(name)

    def hold(self) -> int:
        """The lowest log offset this broker still needs (Heartbeat.hold)."""
        return min([self.state.applied, *self.holds])

    # -- checkpoints and retention (DESIGN §8) ---------------------------------------------

    async def _checkpoint_loop(self) -> None:
        if self.checkpoint_ms <= 0:
            return
        while True:
            await asyncio.sleep(self.checkpoint_ms / 1000)
            ms = self.state.membership
            if not self.joined.is_set() or ms.leader() != self.key or not self.healthy:
                continue
            prev = self.state.checkpoints[-1] if self.state.checkpoints else (-1, "")
            try:
                await asyncio.wait_for(self.submit(Checkpoint(prev[0], prev[1])), 30)
                await self._truncate()
            except (BatonError, TimeoutError) as exc:
                log.warning("checkpoint failed: %s", exc)

    async def _truncate(self) -> None:
        """Drop the log below the checkpoint before the last, once every live runtime
        has applied past it (and no update being served still needs it)."""
        cps = self.state.checkpoints
        if len(cps) < 2:
            return
        target = cps[-2][0]
        hold = self.state.membership.hold()
        if hold is None or hold <= target or target <= self._truncate_asked:
            return
        self._truncate_asked = target
        await self.log.truncate_before(target)
        # What is really gone: a file log deletes whole segments only.
        self.truncated_before = await self.log.start_offset()
        log.debug("log truncated before offset %d (asked %d)", self.truncated_before, target)

    async def leave(self) -> None:
        """Tell the cluster this runtime leaves (clean shutdown): no suspicion wait."""
        if self.joined.is_set() and not self._closing:
            try:
                await asyncio.wait_for(self.submit(Leave()), 2)
            except (BatonError, TimeoutError):
                pass

    async def _heartbeat_loop(self) -> None:
        beat: asyncio.Future[None] | None = None
        while True:
            if beat is None or beat.done():  # no pile of beats while the log is down
                beat = self.submit(
                    Heartbeat(self.role, self.address, dict(self.properties), self.hold())
                )
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

    def submit(self, event: Event[R]) -> asyncio.Future[R]:
        """Append ``event``; the future resolves with its result once durable and applied
        (the result type its class names, cluster/results.py; None for membership events).

        The future fails with the event's BatonError (e.g. QueueNotFound) if
        applying it failed; while the log cannot be written the event waits in the
        outbox and its append is retried (a publish is also kept in the store, so a
        broker that dies meanwhile appends it at its next start). It fails with
        LogUnavailable only when the outbox is full.
        """
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
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
            self._outbox_failures += 1
            if self._outbox_failures == 1 or self._outbox_failures % 1000 == 0:
                log.warning(
                    "cannot keep publishes in the store's outbox (%d batches so far): %s",
                    self._outbox_failures, exc,
                )
            return []
        if self._outbox_failures:
            log.warning("the store's outbox works again after %d failed batches",
                        self._outbox_failures)
            self._outbox_failures = 0
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
            except LogTruncated as exc:
                # Paused or cut off while the others truncated the log past us: this
                # replica cannot go on; it must start again as a new broker (DESIGN §8).
                self.healthy = False
                log.critical(
                    "the log was truncated past this broker's applied offset %d (%s): it"
                    " must rejoin as a new broker", self.state.applied, exc,
                )
                if self.on_truncated is not None:
                    self.on_truncated()
                return
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
            async with self.apply_lock:
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
            catchup = self.catchup  # joining: the hooks track messages not here yet
            for e in effects:
                t = type(e)
                if t is Stored:
                    assert isinstance(e, Stored)
                    batch.put_messages(e.qid, e.first, e.messages, e.enqueued_at, e.publish_time)
                elif t is Removed:
                    assert isinstance(e, Removed)
                    batch.remove(e.qid, e.positions)
                    if catchup is not None:
                        catchup.removed(e.qid, e.positions)
                elif t is RemovedRange:
                    assert isinstance(e, RemovedRange)
                    batch.remove_range(e.qid, e.lo, e.hi)
                    if catchup is not None:
                        catchup.removed(e.qid, range(e.lo, e.hi))
                elif t is Moved:
                    assert isinstance(e, Moved)
                    if not batch.move(
                        e.src_qid, e.src_pos, e.dst_qid, e.dst_pos, e.headers, e.enqueued_at
                    ):
                        if catchup is not None:
                            catchup.missed_move(
                                (e.src_qid, e.src_pos), (e.dst_qid, e.dst_pos), e.headers,
                                e.enqueued_at,
                            )
                        else:
                            log.error(
                                "queue id %d position %d dead-lettered but not in the store",
                                e.src_qid, e.src_pos,
                            )
                elif t is QueueGone:
                    assert isinstance(e, QueueGone)
                    batch.drop_queue(e.qid)
                    if catchup is not None:
                        catchup.removed(e.qid, None)
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
            if type(e) is CheckpointApplied:
                assert isinstance(e, CheckpointApplied)
                self._checked(e)
            elif type(e) is Completed and e.node == node and e.runtime == runtime:
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

    def _checked(self, e: CheckpointApplied) -> None:
        """A checkpoint applied here: compare this replica's digest at the previous one
        with the leader's (DESIGN §8). A difference is a bug: say so loudly."""
        self.last_checkpoint = {"offset": e.offset, "digest": e.digest}
        if e.mine is None or not e.expected:
            return
        if e.mine != e.expected:
            self.digest_mismatches += 1
            log.critical(
                "REPLICA DIVERGED: state digest at log offset %d is %s here but %s on the"
                " leader; this replica's state is wrong (a bug): stop it and start it with"
                " a new data dir, and please report it",
                e.prev_offset, e.mine, e.expected,
            )
        else:
            self.last_checkpoint["verified"] = e.prev_offset

    def _complete(self, done: Completed) -> None:
        fut = self._waiting.pop(done.seq, None)
        if fut is None or fut.done():
            return
        if done.error is not None:
            fut.set_exception(done.error)
        else:
            fut.set_result(done.result)


def _ignore_outcome(fut: asyncio.Future[Any]) -> None:
    """Background membership events: their failures show in the state, not here."""
    if not fut.cancelled():
        fut.exception()
