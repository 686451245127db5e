"""The history checker: does a run's history keep Baton's guarantees (docs/design.md §5)?

Pure: :func:`check` takes the merged records (see :mod:`batonmq.loadtest.history`) in time order
and returns a :class:`CheckResult`; no clock, no files, no broker.

What it counts (each a guarantee of docs/design.md §5):

- ``lost`` (§5.1, §5.5): a confirmed publish that was never accepted anywhere (neither in
  its queue nor in a dead-letter queue it reached), was not dropped by design (rejected,
  or over its delivery limit, on a queue without a dead-letter queue), and cannot be one
  of the messages still ``pending`` at the end. An accept whose outcome is unknown
  (``ack-fail``) counts as accepted: that is not a loss we can prove. Each lost message
  is also classified, as Jepsen's queue checkers do, by where it sits in its queue among
  the confirmed publishes (position order; confirmation order without positions):
  ``lost_prefix`` before the queue's first delivered message, ``lost_postfix`` after its
  last one (or in a queue of which nothing was delivered), ``lost_middle`` between two
  delivered ones. A prefix loss points at old records gone (retention, a log read from
  the wrong offset), a postfix loss at a tail never made durable, a middle loss at single
  records skipped (a corrupt record, an apply bug). The three sum to ``lost``.
- ``unexpected``: a delivery of a message that no producer ever tried to publish (its id
  has no publish-invoke, or its body carries no id): the broker made it up or mixed
  another run's data in.
- ``split_brain`` (§5.2, §6): a message delivered to a consumer on one broker while a
  consumer on *another* broker held it, or accepted through a second broker after an
  ack-ok through the first: two brokers each acted as the queue's owner at once. These
  are double deliveries or double accepts too (counted there as well); this count says
  that two brokers, not one broker's consumers, did it. The result's ``brokers`` lists
  what each broker delivered and accepted (from the ``connected`` records), for
  comparing them.
- ``double_delivery`` (§5.2): a message delivered while another (or the same) consumer
  still held it: delivered, not yet settled (ack-ok / ack-fail / release / reject), and
  its consumer not ended or lost. A consumer whose connection or broker was lost gives up
  its holds at its ``consumer-lost`` record.
- ``redelivered_after_accept`` (§5.3): a delivery after an ``ack-ok`` of that message.
- ``accepted_twice`` (§5.2, §5.3): a second ``ack-ok`` of one message (e.g. a fenced
  consumer's accept of a message that went to another consumer meanwhile): only the
  holder of an acquired message may accept it, and only once.
- ``duplicate_enqueue``: one message id at two positions of one queue (from confirms and
  deliveries). Dead-lettering gives a message a new position in *another* queue: fine.
- ``order`` (§5.7): per consumer and queue, first deliveries (delivery count 0, never
  delivered before) out of position order. Messages returned unread when a consumer of
  the queue ends come back with count 0 at their old position, so a consumer's order is
  only compared between two such ends.
- ``poison_loop`` (§5.5): a delivery whose delivery count reached the queue's limit.
- ``pending``: messages still ready or acquired after the drain (not a violation; it
  bounds what ``lost`` can prove).
- ``two_leaders`` (§7): a candidate's term of a service began (its ``lead`` record)
  while another candidate's term of that service had not ended (its ``lead-end``
  record, or a fault of the broker its connection was on, as for holds below): one
  leader at a time. A candidate records the end of its term before it resigns, and the
  next term is granted only after the resign is applied.
- ``token_order`` (§7): a term whose fencing token is not larger than an earlier term's
  token of the same service.

Faults: a ``fault`` record of a broker going down (``kill9``, ``sigstop``, ``stop``,
``bitflip``, ``truncate``, ``upgrade``), or of
its clients cut from it (``netsplit``, ``client-partition``: the broker gives their
messages back when it finds their connections closed), ends
the holds of every consumer whose worker was connected to that broker (``connected``
records) at that moment: the cluster gives those messages back after its view change,
which is later than the fault, so ending the holds at the fault never hides a double
delivery that happened before it. The client only notices a lost broker later (or, for
a paused one, not at all), which is why its ``consumer-lost`` record is not enough.
A delivery that reaches a worker through that broker while the fault lasts, on the
connection it had when the fault began, was sent before the fault (a paused, killed or
cut-off broker sends nothing): it starts no hold either. One after the fault's end
does: a broker resumed after a pause must not hand out what the cluster gave others.
Service terms follow the same rules: a fault of a candidate's broker ends its term, and
a term granted through that broker while the fault lasts starts none.

Systems without queue positions (RabbitMQ) record position -1: their holds and accepts
are keyed by message id instead, and their order is not checked.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from batonmq.loadtest.history import Op, OpKind

__all__ = ["CheckResult", "check", "VIOLATIONS", "LOST_CLASSES", "BROKER_DOWN_FAULTS"]

#: The counts that make a run fail.
VIOLATIONS = (
    "lost",
    "double_delivery",
    "redelivered_after_accept",
    "accepted_twice",
    "duplicate_enqueue",
    "order",
    "poison_loop",
    "unexpected",
    "split_brain",
    "early_delivery",
    "early_retry",
    "two_leaders",
    "token_order",
)

#: Where the lost messages were in their queues (they sum to ``lost``; see module doc).
LOST_CLASSES = ("lost_prefix", "lost_middle", "lost_postfix")

#: The broker of a record whose worker never said where it is connected.
UNKNOWN_BROKER = "?"

#: Slack (ns) when comparing a delivery with a delay's end: the broker counts whole ms
#: of wall-clock time, the history monotonic ns.
DELAY_SLACK_NS = 5_000_000

#: Fault kinds after which a broker no longer holds its consumers' messages.
BROKER_DOWN_FAULTS = frozenset(
    {"kill9", "sigstop", "stop", "netsplit", "client-partition", "bitflip", "truncate",
     "upgrade"}
)

def _fault_address(op: Op) -> str:
    """The broker address a fault record names ("" if none)."""
    return _parse_settings(op.info.replace(" ", ",")).get("address", "")


#: A message's identity in its queue: its position, or its id where there is no position.
Key = tuple[str, int | str]


def _key(op: Op) -> Key:
    return (op.queue, op.position) if op.position >= 0 else (op.queue, "#" + op.msg)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What the checker found.

    Attributes:
        counts: every violation kind of :data:`VIOLATIONS`, the classes of
            :data:`LOST_CLASSES` and ``pending`` -> count.
        examples: kind -> up to ``max_examples`` human-readable examples.
        stats: informational totals (publishes, deliveries, redeliveries, ...).
        brokers: broker address -> ``deliveries``, ``messages`` (distinct ones),
            ``accepted`` (ack-ok) and ``split_brain`` (deliveries or accepts that
            overlapped another broker's), for comparing what each broker did.
    """

    counts: dict[str, int]
    examples: dict[str, list[str]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    brokers: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True if no guarantee was broken (``pending`` alone does not fail a run)."""
        return all(self.counts.get(k, 0) == 0 for k in VIOLATIONS)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "ok": self.ok,
            "counts": dict(self.counts),
            "examples": {k: list(v) for k, v in self.examples.items() if v},
            "stats": dict(self.stats),
            "brokers": {b: dict(v) for b, v in self.brokers.items()},
        }

    def summary(self) -> str:
        """A few lines for a terminal."""
        verdict = "OK" if self.ok else "FAILED"
        parts = ", ".join(f"{k}={self.counts.get(k, 0)}" for k in (*VIOLATIONS, "pending"))
        lines = [f"checker: {verdict}: {parts}"]
        if self.counts.get("lost", 0):
            lines.append("  lost by place: " + ", ".join(
                f"{k}={self.counts.get(k, 0)}" for k in LOST_CLASSES
            ))
        for kind in VIOLATIONS:
            for ex in self.examples.get(kind, []):
                lines.append(f"  {kind}: {ex}")
        if len(self.brokers) > 1:
            for b, v in sorted(self.brokers.items()):
                lines.append(
                    f"  broker {b}: {v.get('deliveries', 0)} deliveries of"
                    f" {v.get('messages', 0)} messages, {v.get('accepted', 0)} accepted,"
                    f" {v.get('split_brain', 0)} overlapping another broker"
                )
        return "\n".join(lines)


def _parse_settings(info: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in info.split(","):
        key, sep, value = item.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


class _Checker:
    def __init__(self, max_examples: int) -> None:
        self.max_examples = max_examples
        self.counts: dict[str, int] = {k: 0 for k in (*VIOLATIONS, *LOST_CLASSES, "pending")}
        self.examples: dict[str, list[str]] = defaultdict(list)
        # queue -> (delivery_limit or None, has a dead-letter queue)
        self.limits: dict[str, int] = {}
        self.dlq: dict[str, str] = {}
        # (queue, msg) -> positions seen for it (confirm or delivery)
        self.positions: dict[tuple[str, str], set[int]] = defaultdict(set)
        self.confirmed: dict[str, Op] = {}  # msg -> its publish-ok
        self.accepted_msgs: set[str] = set()  # ack-ok or ack-fail anywhere
        self.dropped_msgs: set[str] = set()
        self.delivered_msgs: set[str] = set()
        # (queue, position) -> (consumer, delivery op) while held
        self.holds: dict[Key, tuple[str, Op]] = {}
        self.held_by: dict[str, set[Key]] = defaultdict(set)
        self.accepted_at: dict[Key, Op] = {}
        # worker (the actor's part before '/') -> the broker address it is connected to
        self.worker_address: dict[str, str] = {}
        # Workers whose broker is in a fault that took it down, on the connection they
        # had when it began (fault key -> workers); and each such worker's fault count.
        self.cut_off: dict[tuple[str, str], set[str]] = {}
        self.cut_workers: dict[str, int] = defaultdict(int)
        self.seen_first: set[tuple[str, str]] = set()  # (queue, msg) delivered once
        # order: queue -> epoch (bumped when a consumer of it ends / is lost);
        # (consumer, queue) -> (epoch, last first-delivery position)
        self.queue_epoch: dict[str, int] = defaultdict(int)
        self.last_first: dict[tuple[str, str], tuple[int, int]] = {}
        self.consumer_queues: dict[str, set[str]] = defaultdict(set)
        self.stats: dict[str, int] = defaultdict(int)
        self.invoked: set[str] = set()  # message ids a producer tried to publish
        self.unknown: list[Op] = []  # deliveries of ids nobody published (checked at the end)
        # queue -> keys of its delivered messages (the reference points of lost classes)
        self.delivered_keys: dict[str, set[Key]] = defaultdict(set)
        self.brokers: dict[str, dict[str, int]] = {}
        self.broker_msgs: dict[str, set[str]] = defaultdict(set)

        # Work-queue delays: msg -> no delivery before this t (its publish-invoke plus
        # its delay); (queue, msg) -> no redelivery before this t (a failed release plus
        # the queue's retry delay); queue -> its retry delay (ns).
        self.not_before: dict[str, int] = {}
        self.delayed_msgs: set[str] = set()
        self.retry_after: dict[tuple[str, str], int] = {}
        self.retry_ns: dict[str, int] = {}

        # Service leadership: service -> candidate actor -> its open term's lead record;
        # service -> the largest fencing token granted so far, with its record.
        self.terms: dict[str, dict[str, Op]] = defaultdict(dict)
        self.top_token: dict[str, Op] = {}

    def broker_of(self, actor: str) -> str:
        """The broker an actor's worker is connected to now (from ``connected`` records)."""
        return self.worker_address.get(actor.split("/", 1)[0], UNKNOWN_BROKER)

    def tally(self, broker: str, what: str) -> None:
        row = self.brokers.get(broker)
        if row is None:
            row = self.brokers[broker] = {
                "deliveries": 0, "messages": 0, "accepted": 0, "split_brain": 0,
            }
        row[what] += 1

    def flag(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < self.max_examples:
            self.examples[kind].append(text)

    def release_hold(self, key: Key, consumer: str) -> None:
        held = self.holds.get(key)
        if held is not None and held[0] == consumer:
            del self.holds[key]
            self.held_by[consumer].discard(key)

    def end_consumer(self, consumer: str, queue: str) -> None:
        for key in list(self.held_by.get(consumer, ())):
            if not queue or key[0] == queue:
                self.release_hold(key, consumer)
        for q in [queue] if queue else list(self.consumer_queues.get(consumer, ())):
            self.queue_epoch[q] += 1

    def broker_down(self, op: Op) -> None:
        """A fault took a broker away: its consumers' holds end now (see module doc)."""
        address = _fault_address(op)
        if not address:
            return
        workers = {w for w, a in self.worker_address.items() if a == address}
        self.cut_off[(op.msg, address)] = workers
        for w in workers:
            self.cut_workers[w] += 1
        for consumer in list(self.held_by):
            if self.worker_address.get(consumer.split("/", 1)[0]) == address:
                if self.held_by[consumer]:
                    self.stats["holds_ended_by_faults"] += len(self.held_by[consumer])
                self.end_consumer(consumer, "")
        for terms in self.terms.values():
            for candidate in [c for c in terms if c.split("/", 1)[0] in workers]:
                del terms[candidate]
                self.stats["terms_ended_by_faults"] += 1

    def lead(self, op: Op) -> None:
        """A candidate leads ``op.queue`` with fencing token ``op.count`` from now on."""
        self.stats["terms"] += 1
        if self.cut_workers.get(op.actor.split("/", 1)[0]):
            # Granted through a broker that is down: the fault ended it (module doc).
            self.stats["terms_from_down_brokers"] += 1
            return
        service = op.queue
        top = self.top_token.get(service)
        if top is not None and op.count <= top.count:
            self.flag(
                "token_order",
                f"{service}: {op.actor} leads with token {op.count} at t={op.t}, not above"
                f" {top.actor}'s token {top.count} at t={top.t}",
            )
        if top is None or op.count > top.count:
            self.top_token[service] = op
        terms = self.terms[service]
        for other, began in terms.items():
            if other != op.actor:
                self.flag(
                    "two_leaders",
                    f"{service}: {op.actor} leads (token {op.count}) at t={op.t} while"
                    f" {other} leads (token {began.count}) since t={began.t}",
                )
        terms[op.actor] = op

    def broker_up(self, op: Op) -> None:
        """The fault that took a broker away is over: deliveries through it start holds
        again."""
        address = _fault_address(op)
        for w in self.cut_off.pop((op.msg, address), set()):
            if self.cut_workers.get(w, 0) > 1:
                self.cut_workers[w] -= 1
            else:
                self.cut_workers.pop(w, None)

    def early(self, op: Op) -> None:
        """A delivery before the end of the message's delay, or of its retry delay."""
        due = self.not_before.get(op.msg)
        if due is not None:
            if op.t < due - DELAY_SLACK_NS:
                self.flag(
                    "early_delivery",
                    f"{op.queue}@{op.position} ({op.msg}) delivered to {op.actor} "
                    f"{(due - op.t) / 1e6:.1f} ms before its delay ended",
                )
            del self.not_before[op.msg]  # (the first delivery is the one held)
        due = self.retry_after.pop((op.queue, op.msg), None)
        if due is not None and op.t < due - DELAY_SLACK_NS:
            self.flag(
                "early_retry",
                f"{op.queue}@{op.position} ({op.msg}) redelivered to {op.actor} "
                f"{(due - op.t) / 1e6:.1f} ms before its retry delay ended",
            )

    def deliver(self, op: Op) -> None:
        self.stats["deliveries"] += 1
        if op.msg and (self.not_before or self.retry_after):
            self.early(op)
        key = _key(op)
        if op.count > 0:
            self.stats["redeliveries"] += 1
        self.consumer_queues[op.actor].add(op.queue)
        broker = self.broker_of(op.actor)
        self.tally(broker, "deliveries")
        self.delivered_keys[op.queue].add(key)
        if op.msg:
            self.delivered_msgs.add(op.msg)
            if op.position >= 0:
                self.positions[(op.queue, op.msg)].add(op.position)
        if op.msg not in self.invoked:
            self.unknown.append(op)  # unless a publish of it is recorded after (clock ties)
        if op.msg not in self.broker_msgs[broker]:
            self.broker_msgs[broker].add(op.msg)
            self.tally(broker, "messages")
        held = self.holds.get(key)
        if held is not None:
            self.flag(
                "double_delivery",
                f"{op.queue}@{op.position} ({op.msg}) delivered to {op.actor} at t={op.t} "
                f"while held by {held[0]} since t={held[1].t}",
            )
            other = self.broker_of(held[0])
            if UNKNOWN_BROKER not in (other, broker) and other != broker:
                self.tally(broker, "split_brain")
                self.flag(
                    "split_brain",
                    f"{op.queue}@{op.position} ({op.msg}) delivered through {broker} to "
                    f"{op.actor} at t={op.t} while {held[0]} through {other} held it since "
                    f"t={held[1].t}",
                )
            self.held_by[held[0]].discard(key)
        acc = self.accepted_at.get(key)
        if acc is not None:
            self.flag(
                "redelivered_after_accept",
                f"{op.queue}@{op.position} ({op.msg}) delivered to {op.actor} at t={op.t} "
                f"after {acc.actor}'s ack-ok at t={acc.t}",
            )
        limit = self.limits.get(op.queue)
        if limit is not None and op.count >= limit:
            self.flag(
                "poison_loop",
                f"{op.queue}@{op.position} ({op.msg}) delivered with count {op.count} "
                f"(limit {limit})",
            )
        first_key = (op.queue, op.msg or str(op.position))
        if (
            op.count == 0
            and first_key not in self.seen_first
            and op.position >= 0
            and op.msg not in self.delayed_msgs  # (first delivered once its delay ends)
        ):
            epoch = self.queue_epoch[op.queue]
            last = self.last_first.get((op.actor, op.queue))
            if last is not None and last[0] == epoch and op.position < last[1]:
                self.flag(
                    "order",
                    f"{op.actor} got {op.queue}@{op.position} ({op.msg}) first at t={op.t} "
                    f"after @{last[1]}",
                )
            if last is None or last[0] != epoch or op.position > last[1]:
                self.last_first[(op.actor, op.queue)] = (epoch, op.position)
        self.seen_first.add(first_key)
        if self.cut_workers.get(op.actor.split("/", 1)[0]):
            # Sent before its broker went down (module doc): no hold.
            self.stats["deliveries_from_down_brokers"] += 1
            return
        self.holds[key] = (op.actor, op)
        self.held_by[op.actor].add(key)

    def settle(self, op: Op) -> None:
        key = _key(op)
        kind = op.kind
        if kind == OpKind.ACK_INVOKE:
            return  # the hold lasts until the outcome is known
        self.release_hold(key, op.actor)
        if kind == OpKind.ACK_OK:
            broker = self.broker_of(op.actor)
            self.tally(broker, "accepted")
            first = self.accepted_at.get(key)
            if first is not None:
                self.flag(
                    "accepted_twice",
                    f"{op.queue}@{op.position} ({op.msg}) accepted by {op.actor} at t={op.t} "
                    f"after {first.actor}'s ack-ok at t={first.t}",
                )
                other = self.broker_of(first.actor)
                if UNKNOWN_BROKER not in (other, broker) and other != broker:
                    self.tally(broker, "split_brain")
                    self.flag(
                        "split_brain",
                        f"{op.queue}@{op.position} ({op.msg}) accepted through {broker} by "
                        f"{op.actor} at t={op.t} after {first.actor}'s ack-ok through {other}"
                        f" at t={first.t}",
                    )
                return
            self.accepted_at[key] = op
            if op.msg:
                self.accepted_msgs.add(op.msg)
        elif kind == OpKind.ACK_FAIL:
            if op.msg:
                self.accepted_msgs.add(op.msg)  # outcome unknown: not a provable loss
        elif op.msg and op.queue not in self.dlq:
            limit = self.limits.get(op.queue)
            if kind == OpKind.REJECT or (
                kind == OpKind.RELEASE and limit is not None and op.count + 1 >= limit
            ):
                self.dropped_msgs.add(op.msg)  # dropped by design (no dead-letter queue)

    def run(self, ops: Iterable[Op]) -> CheckResult:
        publish_invoked = 0
        for op in ops:
            kind = op.kind
            if kind == OpKind.DELIVER:
                self.deliver(op)
            elif kind in (
                OpKind.ACK_INVOKE,
                OpKind.ACK_OK,
                OpKind.ACK_FAIL,
                OpKind.RELEASE,
                OpKind.REJECT,
            ):
                self.settle(op)
                retry = self.retry_ns.get(op.queue)
                if retry and kind == OpKind.RELEASE and op.msg:
                    self.retry_after[(op.queue, op.msg)] = op.t + retry
            elif kind == OpKind.PUBLISH_INVOKE:
                publish_invoked += 1
                self.invoked.add(op.msg)
                if op.info.startswith("delay_ms="):
                    self.not_before[op.msg] = op.t + int(op.info[9:]) * 1_000_000
                    self.delayed_msgs.add(op.msg)
            elif kind == OpKind.PUBLISH_OK:
                self.confirmed[op.msg] = op
                if op.position >= 0:
                    self.positions[(op.queue, op.msg)].add(op.position)
            elif kind == OpKind.PUBLISH_FAIL:
                self.stats["publish_failed"] += 1
            elif kind in (OpKind.CONSUMER_LOST, OpKind.CONSUMER_END):
                self.end_consumer(op.actor, op.queue)
                if kind == OpKind.CONSUMER_LOST:
                    self.stats["consumers_lost"] += 1
            elif kind == OpKind.QUEUE:
                settings = _parse_settings(op.info)
                if settings.get("delivery_limit", "").isdigit():
                    self.limits[op.queue] = int(settings["delivery_limit"])
                if settings.get("dead_letter"):
                    self.dlq[op.queue] = settings["dead_letter"]
                if settings.get("retry_ms", "").isdigit():
                    self.retry_ns[op.queue] = int(settings["retry_ms"]) * 1_000_000
            elif kind == OpKind.LEAD:
                self.lead(op)
            elif kind == OpKind.LEAD_END:
                self.terms[op.queue].pop(op.actor, None)
            elif kind == OpKind.FINAL:
                self.counts["pending"] += max(0, op.count)
            elif kind == OpKind.CONNECTED:
                worker = op.actor.split("/", 1)[0]
                self.worker_address[worker] = op.info
                if self.cut_workers.pop(worker, 0):  # a new connection: its own holds
                    for workers in self.cut_off.values():
                        workers.discard(worker)
            elif kind == OpKind.FAULT:
                if op.count == 0:
                    self.stats["faults"] += 1
                    if op.msg in BROKER_DOWN_FAULTS:
                        self.broker_down(op)
                elif op.msg in BROKER_DOWN_FAULTS:
                    self.broker_up(op)
        for (queue, msg), positions in self.positions.items():
            if len(positions) > 1:
                self.flag(
                    "duplicate_enqueue",
                    f"{msg} at {len(positions)} positions of {queue}: {sorted(positions)[:5]}",
                )
        missing = [
            op
            for msg, op in self.confirmed.items()
            if msg not in self.accepted_msgs and msg not in self.dropped_msgs
        ]
        # Up to `pending` of them may still be on a queue: only the rest are proven lost.
        lost = max(0, len(missing) - self.counts["pending"])
        where = self.lost_places()
        for op in missing[:lost]:
            why = "delivered, never accepted" if op.msg in self.delivered_msgs else "never delivered"
            place = where[op.msg]
            self.counts[place] += 1
            self.flag("lost", f"{op.msg} confirmed at {op.queue}@{op.position}: {why}"
                              f" ({place.replace('_', '-')})")
        for op in self.unknown:
            if op.msg not in self.invoked:
                self.flag(
                    "unexpected",
                    f"{op.queue}@{op.position} delivered to {op.actor} at t={op.t}: "
                    + (f"{op.msg} was never published" if op.msg else "its body has no message id"),
                )
        self.stats["publish_invoked"] = publish_invoked
        self.stats["confirmed"] = len(self.confirmed)
        self.stats["accepted"] = len(self.accepted_msgs)
        self.stats["dropped"] = len(self.dropped_msgs)
        self.stats["unaccepted_confirmed"] = len(missing)
        return CheckResult(dict(self.counts), dict(self.examples), dict(self.stats),
                           {b: dict(v) for b, v in sorted(self.brokers.items())})

    def lost_places(self) -> dict[str, str]:
        """For each confirmed message, its lost class should it be lost: where it sits
        among its queue's confirmed publishes relative to the delivered ones."""
        by_queue: dict[str, list[tuple[int, Key, str]]] = defaultdict(list)
        for i, (msg, op) in enumerate(self.confirmed.items()):
            # Position order; confirmation order where the system has no positions.
            by_queue[op.queue].append((op.position if op.position >= 0 else i, _key(op), msg))
        places: dict[str, str] = {}
        for queue, entries in by_queue.items():
            entries.sort()
            seen = self.delivered_keys.get(queue, set())
            ranks = [rank for rank, (_, key, _msg) in enumerate(entries) if key in seen]
            first, last = (ranks[0], ranks[-1]) if ranks else (len(entries), -1)
            for rank, (_, _key_, msg) in enumerate(entries):
                # Relative to the *other* delivered messages: a lost one may have been
                # delivered itself (and never accepted).
                if last <= rank:
                    places[msg] = "lost_postfix"  # nothing delivered after it
                elif first >= rank:
                    places[msg] = "lost_prefix"  # nothing delivered before it
                else:
                    places[msg] = "lost_middle"
        return places


def check(ops: Iterable[Op], max_examples: int = 5) -> CheckResult:
    """Check a merged history (records in time order, as :func:`load_run` returns them).

    Args:
        ops: the records.
        max_examples: how many examples to keep per violation kind.

    Returns:
        The counts, examples and totals; ``result.ok`` is False if any guarantee broke.
    """
    return _Checker(max_examples).run(ops)
