"""The appender: this replica's events onto the log, in order, with group commit.

:meth:`Appender.submit` stamps an event with this process's origin (node id,
runtime id, next sequence number, wall-clock ms) and queues it in the *outbox*; one
task (:meth:`Appender.run`) writes whatever has queued up as one log batch, so one
round trip to the log carries many events and origin sequences reach the log in
order. While the log cannot be written the events wait and the append is retried
with back-off; from the first failed append until one works again, publishes are also
kept in the store's outbox, so a broker that dies meanwhile appends them at its next
start (:meth:`Appender.resubmit_leftover`). While the log works they are not: an append
takes a few milliseconds, and a publish lost with its broker in that time was never
confirmed, so its client sends it again (as it would a publish still in memory); two
store writes per append cost more than the rest of the append path.

A submitted event's future resolves when the event is *both* durable on the log (its
append returned) and applied here (:meth:`Appender.applied`): that is the moment a
command takes effect (docs/design.md §5).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from batonmq.cluster.codec import EventEncoder, MalformedEvent, UnreadableRecord, decode
from batonmq.cluster.effects import Completed
from batonmq.cluster.errors import (
    BatonError, LogCorrupt, LogUnavailable, MessageTooLarge, ShuttingDown, StoreError,
)
from batonmq.cluster.events import AnyEvent, Enqueue, Event, Origin, RoutedEnqueue

#: The publishes: kept in the store's outbox while the log cannot be written.
_PUBLISHES = (Enqueue, RoutedEnqueue)
from batonmq.cluster.health import Health
from batonmq.cluster.log import Log
from batonmq.cluster.results import Result
from batonmq.store import Store

__all__ = ["Appender", "ignore_outcome", "R"]

#: What a submitted event answers (its class names it: cluster/events.py).
R = TypeVar("R", bound="Result | None")

log = logging.getLogger("baton.node")

#: Bytes a log backend may add per record, counted when cutting appends to size.
_RECORD_OVERHEAD = 64

#: Seconds lingering stays off once lingers gather next to nothing (then one is tried
#: again): a client that sends one command at a time pays a linger at most this often.
LINGER_RETRY_S = 0.5


class Appender:
    """Stamps, queues and appends this runtime's events; completes their futures.

    Args:
        node_id: this broker's persistent id.
        runtime_id: this process's runtime id.
        log: the ordered log.
        store: this broker's store (its outbox keeps publishes while they wait).
        health: set False while appends fail.
        clock: wall-clock milliseconds.
        max_append: most events per log append.
        max_outbox: most events waiting for the log; beyond it commands fail with
            LogUnavailable at once.
    """

    def __init__(
        self,
        node_id: str,
        runtime_id: str,
        log: Log,
        store: Store,
        health: Health,
        *,
        clock: Callable[[], int],
        max_append: int,
        max_outbox: int,
    ) -> None:
        self.node_id = node_id
        self.runtime_id = runtime_id
        self.log = log
        self.store = store
        self.health = health
        self.closing = False  # set by close(): new submissions fail with ShuttingDown
        # Why it closes (ShuttingDown's message); the whole broker unless said otherwise.
        self.closing_why = "the broker is shutting down"
        self.halted: str | None = None  # set by halt(): why this broker takes no commands
        self._clock = clock
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
        self._outbox_ready = asyncio.Event()
        #: The offset applied here (the node sets it): an append that lands at or
        #: below it means records were cut from the log's end.
        self.applied_offset: Callable[[], int] = lambda: -1
        # seq -> the future submit() returned: each of its event's result type.
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._durable_seq = 0  # every own seq <= this is durable on the log
        self._stashed: dict[int, Completed] = {}  # applied before their append returned
        # Told the seconds each successful log append took, once per batch (the broker's
        # metrics, broker/metrics.py); never per event.
        self.append_observer: Callable[[float], None] | None = None
        #: Microseconds to wait before taking a batch (0: none): more events per append
        #: (one write, one fsync, one apply cycle for more of them), for that much more
        #: latency (``append_linger_us``, docs/performance.md "Changes and their effect").
        #: Only while lingering pays: see :meth:`_linger`.
        self.linger_us = 0
        self._gathered = 0.5  # events a linger gathered: a moving average
        self.lingers = 0  # lingers waited (the metric baton_append_lingers_total)
        self._linger_off_until = 0.0  # (loop time) lingering paid too little

    # -- stamping and queueing -----------------------------------------------------

    @property
    def outbox_depth(self) -> int:
        """Events waiting for their log append to start (the metrics' outbox depth)."""
        return len(self._outbox)

    @property
    def format(self) -> int:
        """The format records are written in (cluster/features.py)."""
        return self._encoder.format

    @format.setter
    def format(self, fmt: int) -> None:
        # Only ever raised, once the cluster has applied the flag that brings it: every
        # live runtime reads it by then. Records already stamped keep their format.
        self._encoder.format = fmt

    @property
    def seq(self) -> int:
        """The last origin sequence number this runtime gave on this log."""
        return self._seq

    def continue_after(self, seq: int) -> None:
        """Number from after ``seq``: this runtime appended up to it on this log before
        (a data partition it left and is given again), where a lower number would be
        taken for a duplicate."""
        self._seq = max(self._seq, seq)

    def stamp(self, event: AnyEvent) -> bytes:
        """The record of ``event`` with this runtime's next origin sequence number."""
        self._seq += 1
        return self._encoder.encode(
            Origin(self.node_id, self.runtime_id, self._seq, self._clock()), event
        )

    def submit(self, event: Event[R]) -> asyncio.Future[R]:
        """Append ``event``; the future resolves with its result once durable and applied.

        The future fails with the event's BatonError (e.g. QueueNotFound) if
        applying it failed; while the log cannot be written the event waits in the
        outbox and its append is retried (a publish is also kept in the store, so a
        broker that dies meanwhile appends it at its next start). It fails with
        LogUnavailable only when the outbox is full.
        """
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        if self.closing:
            fut.set_exception(ShuttingDown(self.closing_why))
            return fut
        if self.halted is not None:
            fut.set_exception(ShuttingDown(self.halted))
            return fut
        if len(self._outbox) >= self._max_outbox:
            fut.set_exception(
                LogUnavailable(
                    f"{len(self._outbox)} events wait for the log {self.log.url}, which cannot"
                    f" be written now ({self._append_error or 'too slow'}); try again later"
                )
            )
            return fut
        record = self.stamp(event)
        seq = self._seq
        if len(record) > self.log.max_record:
            # Refused alone, so it cannot fail the other events of its append.
            fut.set_exception(
                MessageTooLarge(
                    f"event of {len(record)} bytes is above the log's record limit of "
                    f"{self.log.max_record}; publish smaller batches"
                )
            )
            return fut
        self._outbox.append((seq, record, type(event) in _PUBLISHES))
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

    # -- appending -----------------------------------------------------------------

    async def run(self) -> None:
        """Append what the outbox holds, batch after batch, forever."""
        while True:
            await self._outbox_ready.wait()
            if self.linger_us and len(self._outbox) < self._max_append:
                await self._linger()
            batch = self._take_batch()
            if not self._outbox:
                self._outbox_ready.clear()
            if not batch:
                continue
            kept: list[int] = []
            if self._append_error is not None:  # the log is failing: keep them now
                kept = self._keep([(seq, r) for seq, r, keep in batch if keep])
            records = [r for _, r, _ in batch]
            appended = await self._append_retrying(records, batch, kept)
            if kept:  # on the log now, or refused for good (the client got the error)
                self._unkeep(self.runtime_id, kept)
            if not appended:
                continue
            self._durable_seq = batch[-1][0]
            for seq, _, _ in batch:
                done = self._stashed.pop(seq, None)
                if done is not None:
                    self._complete(done)

    async def _linger(self) -> None:
        """Wait ``linger_us`` for more events to share the append, while that pays.

        It pays when independent events keep coming (many clients, a steady rate):
        each append then carries those of several turns, and the write, the sync, the
        apply, the store's write batch and the answers are paid once for all of them.
        It does not when the next event waits for this one (a client that sends one
        command at a time, a message's acquire behind its enqueue): nothing comes in
        meanwhile, and the wait is only latency. So when the lingers have gathered
        less than half an event on average (a moving average over the last few),
        lingering is off for :data:`LINGER_RETRY_S`; then one linger is tried again,
        and one that gathers an event turns it back on. The first linger is such a
        try.
        """
        loop = asyncio.get_running_loop()
        if loop.time() < self._linger_off_until:
            return
        before = len(self._outbox)
        self.lingers += 1
        await asyncio.sleep(self.linger_us / 1e6)
        gathered = self._gathered = 0.75 * self._gathered + 0.25 * (len(self._outbox) - before)
        if gathered < 0.5:
            self._linger_off_until = loop.time() + LINGER_RETRY_S
            self._gathered = 0.5

    async def _append_retrying(
        self, records: list[bytes], batch: list[tuple[int, bytes, bool]], kept: list[int]
    ) -> bool:
        """Append, retrying with back-off while the log is unavailable. Returns False
        if the batch was refused for good (its futures failed). ``kept``: the seqs of
        the batch in the store's outbox; its publishes are added once an append fails."""
        delay = 0.05
        while True:
            started = time.perf_counter()
            # Read before the append: the log's end is above it then, unless records
            # were cut from it (a join update may raise it meanwhile).
            applied = self.applied_offset()
            try:
                first = await self.log.append(records)
            except LogUnavailable as exc:
                # Kafka down, disk full: the events wait in order; appliers drop the
                # duplicates a retry of an append with an unknown outcome may make.
                if self._append_error is None:
                    log.error("cannot append to the log, retrying: %s", exc)
                self._append_error = str(exc)
                if not kept:
                    kept += self._keep([(seq, r) for seq, r, keep in batch if keep])
                self.health.ok = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            except LogCorrupt as exc:
                # The file log's last segment is damaged before its end: nothing can be
                # appended until an operator repairs it (docs/operations.md). Fail the
                # batch at once, say so once, and let the next batch try again.
                self.health.ok = False
                self.health.problem = f"log corrupt: {exc}"
                if self._append_error != str(exc):
                    log.critical(
                        "LOG CORRUPT: cannot append: %s. Run `baton log verify --log %s`;"
                        " stop every broker on this log and run `baton log repair`.",
                        exc, self.log.url,
                    )
                self._append_error = str(exc)
                self._fail_batch(batch, exc, quiet=True)
                return False
            except BatonError as exc:
                self._fail_batch(batch, exc)
                return False
            except Exception as exc:  # a backend bug must not kill the appender
                log.exception("log append failed")
                self._fail_batch(batch, LogUnavailable(f"log append failed: {exc}"))
                return False
            if first <= applied:
                self._log_cut(first, applied, batch)
                return False
            if self.append_observer is not None:
                self.append_observer(time.perf_counter() - started)
            if self._append_error is not None:
                log.warning("appending to the log works again")
                self._append_error = None
            return True

    def _log_cut(self, end_before: int, applied: int, batch: list[tuple[int, bytes, bool]]) -> None:
        """The batch landed at offsets this broker has applied already: records were
        cut from the log's end (a segment truncated, or restored from an older copy).
        Nothing appended now is ever applied here, so the broker says so loudly, once,
        reports it in its health for good, and fails the commands at once instead of
        letting them time out."""
        problem = (
            f"the log ends at offset {end_before}, below offset {applied} applied here:"
            " records were cut from its end; run `baton log verify`"
        )
        if self.health.log_cut is None:
            log.error(
                "LOG CUT: the log %s ends at offset %d, below offset %d that this broker has"
                " applied: records were removed from its end (a truncated or older segment"
                " file). What is appended now lands at offsets already applied and is never"
                " applied: commands fail. Run `baton log verify --log %s` to see the"
                " damage; stop every broker on this log, put the missing records back (the"
                " segment from a backup), or start the brokers on new data dirs and a new"
                " log.", self.log.url, end_before, applied, self.log.url,
            )
        self.health.cut(end_before, applied, problem)
        self._fail_batch(batch, LogCorrupt(problem), quiet=True)

    def _fail_batch(
        self, batch: list[tuple[int, bytes, bool]], exc: BatonError, quiet: bool = False
    ) -> None:
        if not quiet:
            log.warning("append of %d events failed: %s", len(batch), exc)
        for seq, _, _ in batch:
            fut = self._waiting.pop(seq, None)
            if fut is not None and not fut.done():
                fut.set_exception(exc)

    # -- the store's outbox ----------------------------------------------------------

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

    def load_leftover(self) -> None:
        """Read what earlier runs of this node kept in the store's outbox (at start,
        before anything else touches the store)."""
        self._leftover = self.store.outbox_load()

    def resubmit_leftover(self) -> None:
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
            except (MalformedEvent, UnreadableRecord) as exc:
                log.warning("outbox entry %s/%d unreadable, dropped: %s", runtime, seq, exc)
                continue
            if type(event) in _PUBLISHES:
                self.submit(event).add_done_callback(ignore_outcome)
                again += 1
        log.info("publishing again %d publishes kept by an earlier run of this node", again)
        for runtime, seqs in by_runtime.items():
            self._unkeep(runtime, seqs)
        self._leftover = []

    # -- completion ------------------------------------------------------------------

    def applied(self, done: Completed) -> None:
        """One of this runtime's events was applied: complete its future now if its
        append returned, else when it does."""
        if done.seq <= self._durable_seq:
            self._complete(done)
        else:
            self._stashed[done.seq] = done

    def _complete(self, done: Completed) -> None:
        fut = self._waiting.pop(done.seq, None)
        if fut is None or fut.done():
            return
        if done.error is not None:
            fut.set_exception(done.error)
        else:
            fut.set_result(done.result)

    # -- closing ---------------------------------------------------------------------

    async def close(self, timeout: float = 5.0, why: str | None = None) -> None:
        """Refuse new events and wait (up to ``timeout`` seconds) until the outbox is
        on the log. ``why``: what ShuttingDown says (default: the broker shuts down)."""
        if why is not None:
            self.closing_why = why
        self.closing = True
        deadline = time.monotonic() + timeout
        while self._outbox and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def halt(self, batch: int, why: str = "an internal error") -> None:
        """Applying stopped for good at the batch from offset ``batch``: refuse new
        events at once and fail the waiting ones, instead of letting their callers wait
        for an apply that will not come before a restart. A waiting event may already be
        on the log (the other brokers apply it), so its caller is told the outcome is
        unknown."""
        self.halted = (
            f"this broker stopped applying the log at offset {batch} ({why}, see its log)"
            " and takes no commands until it is restarted; use another broker"
        )
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(
                    ShuttingDown(
                        f"{self.halted}. This command's outcome is unknown: it may be on the log,"
                        " where the other brokers apply it (with an idempotency key, sending it"
                        " again through another broker applies it once)"
                    )
                )
        self._waiting.clear()

    def fail_waiting(self) -> None:
        """Fail every future still waiting with ShuttingDown (the tasks have stopped):
        its outcome is unknown (it may be on the log)."""
        why = f"{self.closing_why}; this command's outcome is unknown"
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ShuttingDown(why))
        self._waiting.clear()


def ignore_outcome(fut: asyncio.Future[Any]) -> None:
    """Background events (membership, republished leftovers): their failures show in
    the state, not here."""
    if not fut.cancelled():
        fut.exception()
