"""Dead-lettering: a message leaving its queue for its dead-letter queue or exchange,
or dropped (docs/design.md §5, §16). Pure: no I/O, no clock.

:class:`DeadLettering` is a part of :class:`~batonmq.cluster.queues.QueueIndex` (its
base class), kept here so that each module stays readable: it moves a dead letter in
the store into the queues it goes to (copies to all but the last), makes room in a full
drop-head dead-letter queue, and, on a data partition of a split log, holds a dead
letter for a queue elsewhere in the partition's outbox (cluster/forwarding.py).
"""

from __future__ import annotations

from batonmq.cluster.effects import Effect, Moved, ReadyMore, Removed
from batonmq.cluster.exchanges import Exchanges
from batonmq.cluster.forwarding import OUTBOX_QID, DeadLetter, Forwards
from batonmq.cluster.queue_state import Ledger, QueueState

__all__ = ["DeadLettering"]


class DeadLettering:
    """The dead-letter transitions of the queue index (which sets these attributes)."""

    ledger: Ledger
    exchanges: Exchanges
    queues: dict[str, QueueState]
    dirty: set[str]
    away: Forwards | None

    def _expire_one(self, q: QueueState, pos: int, out: list[Effect]) -> None:
        """The message at ``pos`` (taken from the ready ones) outlived its own TTL."""
        q.expired += 1
        self._dead_letter(q, pos, "expired", out, count=False)

    def _dead_letter(
        self,
        q: QueueState,
        pos: int,
        reason: str,
        out: list[Effect],
        count: bool = True,
        was_acquired: bool = False,
    ) -> None:
        """Move one message (no longer ready nor acquired) to q's DLQ, or drop it.

        ``x-death-delivery-count`` is its failed deliveries: the failed releases so
        far, plus the delivery it was acquired for if that one failed now (a reject,
        the release at the limit); ``x-death-acquired-count`` its hand-outs.
        """
        delivered = q.counts.pop(pos, 0) + (1 if was_acquired else 0)
        if q.prio:
            q.prio.pop(pos, None)
        headers_of: dict[str, object] = {}  # what a headers exchange routes it by
        if q.ttls:
            q.ttls.pop(pos, None)
            headers_of = q.dl_headers.pop(pos, headers_of)
        handed = q.acq_counts.pop(pos, 0) + (1 if was_acquired else 0)
        headers: dict[str, object] = {
            "x-death-reason": reason,
            "x-death-queue": q.name,
            "x-death-position": pos,
            "x-death-delivery-count": delivered,
            "x-death-acquired-count": handed,
        }
        key: str | None = None  # the routing key, when routed through an exchange
        first: dict[str, object] | None = None
        targets: list[QueueState] = []
        elsewhere = False  # on a data partition: routed by its leader (forwarding.py)
        if q.dead_letter is not None:
            dlq = self.queues.get(q.dead_letter)
            if dlq is not None:
                targets.append(dlq)
            else:
                elsewhere = self.away is not None
        elif q.dead_letter_exchange is not None:
            # Routed through the exchange's bindings as they are at this log position:
            # the same on every replica. Never back into the queue it left.
            dl_key = q.dead_letter_routing_key
            key = q.key_of(pos) if dl_key is None else dl_key
            exchange = q.dead_letter_exchange
            if self.away is not None:
                elsewhere = True  # the bindings are on control
            elif self.exchanges.get(exchange) is not None:
                targets = [
                    self.queues[n]
                    for n in self.exchanges.route(exchange, key, headers_of, self.queues)
                    if n != q.name
                ]
            headers.update({
                "x-death-exchange": exchange,
                "x-death-routing-key": key,
                "x-last-death-reason": reason,
                "x-last-death-queue": q.name,
                "x-last-death-exchange": exchange,
            })
            # Set by the first dead-lettering only (a header of the name stays).
            first = {
                "x-first-death-reason": reason,
                "x-first-death-queue": q.name,
                "x-first-death-exchange": exchange,
            }
        if elsewhere and self.away is not None:
            # Out of the queue now, into this partition's outbox until it is routed and
            # forwarded (docs/design.md §16): every replica records the same number.
            n = self.away.hold(DeadLetter(
                q.name, q.dead_letter, q.dead_letter_exchange,
                key if key is not None else (q.dead_letter or ""),
            ))
            out.append(Moved(q.qid, pos, OUTBOX_QID, n, headers, self.ledger.clock, False, first))
            if count:
                q.dead_lettered += 1
            return
        if self.move_dead_letter(q.qid, pos, targets, key, headers, first, out):
            if count:
                q.dead_lettered += 1
        else:
            out.append(Removed(q.qid, [pos]))
            if count:
                q.dropped += 1

    def move_dead_letter(
        self,
        src_qid: int,
        src_pos: int,
        targets: list[QueueState],
        key: str | None,
        headers: dict[str, object],
        first: dict[str, object] | None,
        out: list[Effect],
        keep: bool = False,
    ) -> bool:
        """Move a dead letter at (``src_qid``, ``src_pos``) in the store into each of
        ``targets`` that has room (copies to all but the last, which it moves to unless
        ``keep``); False if none took it (the caller removes it). ``key``: the routing
        key it goes with (None: each queue's name, as the default exchange sends it)."""
        moves: list[tuple[QueueState, int]] = []
        for dlq in targets:
            if (
                dlq.max_length is not None
                and dlq.length >= dlq.max_length
                and dlq.overflow == "drop-head"
                and dlq.ready > 0
            ):
                # A full drop-head DLQ makes room as it would for a publish; its oldest
                # ready message is dropped (not dead-lettered on: DLQ chains may cycle).
                for head in dlq.take_ready(1):
                    dlq.forget((head,))
                    dlq.dropped += 1
                    out.append(Removed(dlq.qid, [head]))
                self.dirty.add(dlq.name)
            if dlq.max_length is None or dlq.length < dlq.max_length:
                dst = dlq.next_pos
                if dlq.tracks_keys:
                    dlq.note_key(dst, dlq.name if key is None else key)
                dlq.next_pos += 1
                dlq.enqueued += 1
                self.dirty.add(dlq.name)
                moves.append((dlq, dst))
        if not moves:
            return False
        clock = self.ledger.clock
        last = len(moves) - 1
        for i, (dlq, dst) in enumerate(moves):
            # Copies to all but the last target; the last one moves it.
            out.append(Moved(src_qid, src_pos, dlq.qid, dst, headers, clock,
                             keep or i < last, first))
            out.append(ReadyMore(dlq.name))
        return True
