"""The applier: the log into the state, the state's effects into the store, then out.

One task (:meth:`Applier.run`) tails the log from the applied offset. For each batch
of records it applies every record to the pure :class:`~batonmq.cluster.state.State`
under the apply lock, writes the batch's effects and snapshots to the store in one
write batch together with the batch's last offset (:meth:`Applier.persist`), and
then dispatches the effects: this runtime's completions to the appender, checkpoints
to the digest check, and all of them to the listener (the broker). Outside the apply
lock the state and the store agree.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from batonmq.cluster.codec import MalformedEvent, UnreadableRecord, decode
from batonmq.cluster.effects import (
    CheckpointApplied,
    Completed,
    Effect,
    Moved,
    QueueGone,
    Removed,
    RemovedRange,
    Stored,
)
from batonmq.cluster.errors import InvalidArgument, LogCorrupt, LogTruncated, StoreError
from batonmq.cluster.events import EnableFeatures
from batonmq.cluster.health import Health
from batonmq.cluster.log import UNOPENED, Log
from batonmq.cluster.state import State
from batonmq.store import Store

__all__ = ["Applier", "EffectListener", "Tracker"]

#: Seconds between two looks at a corrupt log (it does not mend itself; an operator
#: repairs it with every broker stopped, docs/operations.md).
CORRUPT_RECHECK_S = 30

log = logging.getLogger("baton.node")


class _Unreadable(Exception):
    """A record this build cannot read (``args``: its offset, why): applying stops
    before it, for good."""


class _ApplyFailed(Exception):
    """An unexpected exception while applying or storing a batch (a bug): the state in
    memory may be half-way through the batch, so applying must stop, not retry."""

EffectListener = Callable[[list[Effect]], None]
MessageKey = tuple[int, int]  # (qid, position)


class Tracker(Protocol):
    """What a joining broker's update tracks of the applied batches (messages whose
    bodies may not be here yet); :class:`batonmq.cluster.update.Catchup` is one."""

    def removed(self, qid: int, positions: list[int] | range | None) -> None:
        """Messages left their queue (None: the whole queue was deleted)."""
        ...

    def missed_move(
        self, src: MessageKey, dst: MessageKey, headers: dict[str, Any], at: int,
        defaults: dict[str, Any] | None = None,
    ) -> None:
        """The log dead-lettered ``src`` before its body arrived here."""
        ...


class Applier:
    """Applies the log to the state and persists each batch before dispatching it.

    Args:
        node_id: this broker's persistent id.
        runtime_id: this process's runtime id (its completions are dispatched).
        state: the replicated state.
        log: the ordered log.
        store: this broker's store.
        health: set False while reading or storing fails, True after each batch.
        completed: called with each of this runtime's applied events.
        checkpointed: called with each checkpoint applied.
        after_batch: called after each batch is stored and dispatched.
        truncated: called if the log was truncated past the applied offset (the
            applier stops).
        joining: the update being taken in, if any (its hooks see the effects).
    """

    def __init__(
        self,
        node_id: str,
        runtime_id: str,
        state: State,
        log: Log,
        store: Store,
        health: Health,
        *,
        completed: Callable[[Completed], None],
        checkpointed: Callable[[CheckpointApplied], None],
        after_batch: Callable[[], None],
        truncated: Callable[[], None],
        joining: Callable[[], Tracker | None],
        halted: Callable[[int, str], None],
    ) -> None:
        self.node_id = node_id
        self.runtime_id = runtime_id
        self.state = state
        self.log = log
        self.store = store
        self.health = health
        self.listener: EffectListener | None = None
        self.applied_event = asyncio.Event()  # set after every applied batch (tests, tools)
        # Held while a log batch is applied and stored: state == store outside it.
        self.lock = asyncio.Lock()
        self.keys_forgotten = 0  # publish keys below this seq are deleted from the store
        self.stopped = False  # applying stopped on an unexpected exception (see run)
        #: Set when applying stopped at a record this build cannot read: (offset, why).
        self.unreadable: tuple[int, str] | None = None
        self._completed = completed
        self._checkpointed = checkpointed
        self._after_batch = after_batch
        self._truncated = truncated
        self._halted = halted
        self._joining = joining

    async def run(self) -> None:
        """Apply the log forever. A failing read (log unreachable) is logged loudly and
        retried from the applied offset: the broker stays up, its commands wait, and
        ``health`` is not ok until applying works again.

        A corrupt record (``LogCorrupt``) is never skipped: it may be a confirmed
        publish, and every replica must apply the same records. Applying stops there;
        the broker says so once (CRITICAL, naming the segment and offset, and the
        tools: docs/operations.md), reports it in ``health``, and looks again only
        every :data:`CORRUPT_RECHECK_S` seconds, quietly (no busy retry loop).

        A record this build cannot read (a format above its own or an unknown event
        type: a newer build wrote it, ``UnreadableRecord``) is never skipped either:
        skipping it would leave this replica unlike its peers. Applying stops before it
        for good (CRITICAL, ``health`` false with the reason, ``unreadable`` set for the
        metrics), the records before it applied and stored, and commands fail fast.

        An unexpected exception while applying a batch (a bug in the state machine or
        a store backend) stops applying for good, with a CRITICAL log and ``health``
        false: the state in memory may hold part of the batch and the store does not,
        so retrying would skip or lose it. The store keeps the last whole batch; a
        restart applies the log again from there. Commands fail fast meanwhile
        (``halted``: the appender refuses new ones and fails those waiting).
        """
        delay = 0.5
        corrupt_since: str | None = None
        while True:
            try:
                await self._apply_from(self.state.applied + 1)
            except asyncio.CancelledError:
                raise
            except LogCorrupt as exc:
                self.health.ok = False
                self.health.problem = f"log corrupt after offset {self.state.applied}: {exc}"
                if corrupt_since != str(exc):
                    corrupt_since = str(exc)
                    log.critical(
                        "LOG CORRUPT: cannot apply past offset %d: %s. This broker stops"
                        " applying there (a corrupt record is never skipped) and serves nothing"
                        " newer. Run `baton log verify --log %s` to list the damage; stop every"
                        " broker on this log and run `baton log repair --log %s`; then start"
                        " them again. Looking again every %ds.",
                        self.state.applied, exc, self.log.url, self.log.url, CORRUPT_RECHECK_S,
                    )
                await asyncio.sleep(CORRUPT_RECHECK_S)
            except _Unreadable as exc:
                offset, why = exc.args
                self.health.ok = False
                self.stopped = True
                self.unreadable = (offset, why)
                self.health.problem = (
                    f"stopped applying at log offset {offset}: a record this build cannot"
                    f" read ({why}); upgrade this broker"
                )
                log.critical(
                    "UNREADABLE RECORD at log offset %d: %s. This broker stops applying"
                    " there (such a record is never skipped: its peers apply it) and takes"
                    " no commands; upgrade it to the build the other brokers run and start"
                    " it again (it resumes from offset %d).", offset, why, self.state.applied,
                )
                self._halted(offset, "a record this build cannot read")
                return
            except _ApplyFailed as exc:
                self.health.ok = False
                self.stopped = True
                log.critical(
                    "applying the log stopped at the batch from offset %s: %r; this broker"
                    " applies nothing more until it is restarted (it resumes from the last"
                    " stored batch)", exc.args[0], exc.__cause__, exc_info=exc.__cause__,
                )
                self._halted(exc.args[0], "an internal error")
                return
            except LogTruncated as exc:
                # Paused or cut off while the others truncated the log past us: this
                # replica cannot go on; it must start again as a new broker (docs/design.md §8).
                self.health.ok = False
                log.critical(
                    "the log was truncated past this broker's applied offset %d (%s): it"
                    " must rejoin as a new broker", self.state.applied, exc,
                )
                self._truncated()
                return
            except Exception as exc:
                self.health.ok = False
                corrupt_since = None
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
            unopened: list[int] = []
            unreadable: tuple[int, str] | None = None
            async with self.lock:
                try:
                    for i, (offset, record) in enumerate(records):
                        if record == UNOPENED:
                            # A sealed record this broker's keys do not open (a foreign
                            # writer, a retired key): skipped at its offset like every
                            # replica does (docs/log-sealing.md).
                            unopened.append(offset)
                            state.skip_malformed(offset, unopened=True)
                            continue
                        try:
                            origin, event = decode(record)
                        except MalformedEvent as exc:
                            log.warning("log offset %d: malformed record ignored: %s", offset, exc)
                            state.skip_malformed(offset)
                            if exc.origin is not None:
                                # Its writer's command fails now rather than never.
                                o = exc.origin
                                why = f"the event was written but cannot be applied: {exc.message}"
                                out.append(Completed(
                                    o.node, o.runtime, o.seq, None, InvalidArgument(why)
                                ))
                            continue
                        except UnreadableRecord as exc:
                            unreadable = (offset, exc.message)
                            records = records[:i]  # the batch ends before it
                            break
                        if type(event) is EnableFeatures:
                            unknown = state.enables_unknown(event, origin)
                            if unknown:
                                unreadable = (offset, (
                                    f"it enables feature flag(s) {', '.join(unknown)}, which"
                                    " this build does not know (a newer build's cluster)"
                                ))
                                records = records[:i]
                                break
                        state.apply(offset, origin, event, out)
                    if records:
                        await self.persist(out, records[-1][0])
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    raise _ApplyFailed(records[0][0]) from exc
            if records:
                self._after(out, unopened)
            if unreadable is not None:
                raise _Unreadable(*unreadable)

    def _after(self, out: list[Effect], unopened: list[int]) -> None:
        """What follows a stored batch: the log line about unopened records, health,
        the effects out to their listeners."""
        if unopened:
            # One line a batch: a writer without the key must not flood the log.
            log.warning(
                "%d log records between offsets %d and %d do not open with this"
                " broker's keys: ignored (a writer without the key, or a retired key)",
                len(unopened), unopened[0], unopened[-1],
            )
        self.health.recovered()
        self._dispatch(out)
        self._after_batch()
        self.applied_event.set()
        self.applied_event.clear()

    async def persist(self, effects: list[Effect], offset: int) -> None:
        """Write the batch's effects and snapshots atomically with ``offset`` (the
        caller holds the apply lock).

        A failing store (disk full) stalls applying — retried with back-off — but
        never crashes the broker or skips a batch.
        """
        meta, queues = self.state.take_dirty()
        exchanges = self.state.take_exchanges()
        keys, forget_below = self.state.take_keys()
        forget = range(self.keys_forgotten, forget_below)
        delay = 0.1
        while True:
            batch = self.store.batch()
            catchup = self._joining()  # joining: the hooks track messages not here yet
            for e in effects:
                match e:
                    case Stored():
                        batch.put_messages(e.qid, e.first, e.messages, e.enqueued_at, e.publish_time)
                    case Removed():
                        batch.remove(e.qid, e.positions)
                        if catchup is not None:
                            catchup.removed(e.qid, e.positions)
                    case RemovedRange():
                        batch.remove_range(e.qid, e.lo, e.hi)
                        if catchup is not None:
                            catchup.removed(e.qid, range(e.lo, e.hi))
                    case Moved():
                        if not batch.move(
                            e.src_qid, e.src_pos, e.dst_qid, e.dst_pos, e.headers, e.enqueued_at,
                            e.keep, e.defaults,
                        ):
                            if catchup is not None:
                                catchup.missed_move(
                                    (e.src_qid, e.src_pos), (e.dst_qid, e.dst_pos), e.headers,
                                    e.enqueued_at, e.defaults,
                                )
                            else:
                                log.error(
                                    "queue id %d position %d dead-lettered but not in the store",
                                    e.src_qid, e.src_pos,
                                )
                    case QueueGone():
                        batch.drop_queue(e.qid)
                        if catchup is not None:
                            catchup.removed(e.qid, None)
            for name, snap in queues.items():
                batch.put_queue(name, snap)
            if meta is not None:
                batch.put_meta(meta)
            if exchanges is not None:
                batch.put_exchanges(exchanges)
            if keys or forget:
                batch.put_keys(keys, forget)
            try:
                self.store.commit(batch, offset)
            except StoreError as exc:
                if self.health.ok:
                    log.error("store write failed, retrying (applying is stalled): %s", exc)
                self.health.ok = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.keys_forgotten = forget_below
            if not self.health.ok:
                log.warning("store writes work again")
            self.health.ok = self.health.log_cut is None
            return

    def _dispatch(self, effects: list[Effect]) -> None:
        node, runtime = self.node_id, self.runtime_id
        for e in effects:
            match e:
                case CheckpointApplied():
                    self._checkpointed(e)
                case Completed() if e.node == node and e.runtime == runtime:
                    self._completed(e)
        if self.listener is not None:
            try:
                self.listener(effects)
            except Exception:
                log.exception("effect listener failed")
