"""What applying an event asks the edges to do: the effects :meth:`State.apply` emits.

The pure core changes only its own index; every consequence outside it (a message body
to store or forget, a consumer to feed, a leader to announce) is one of these frozen
values, appended to the ``out`` list of :meth:`batonmq.cluster.state.State.apply`. The
node driver writes the store's part in one batch with the log offset, then hands all of
them to the broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batonmq.cluster.errors import BatonError
from batonmq.cluster.results import Result

__all__ = [
    "Effect",
    "Completed",
    "Stored",
    "Removed",
    "RemovedRange",
    "Moved",
    "Acquired",
    "ReadyMore",
    "QueueGone",
    "OwnerChanged",
    "MembersChanged",
    "CheckpointApplied",
    "LeaderChanged",
    "HandoverRequested",
    "RightsChanged",
]


class Effect:
    """Base of what ``apply`` asks the edges (store, broker) to do."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Completed(Effect):
    """The event (node, runtime, seq) was applied: its command's completion, with what
    applying it answered (None for the membership events, and with ``error``)."""

    node: str
    runtime: str
    seq: int
    result: Result | None
    error: BatonError | None = None


@dataclass(frozen=True, slots=True)
class Stored(Effect):
    """Store new messages at positions ``first ..`` of queue ``qid``."""

    qid: int
    first: int
    messages: tuple[tuple[bytes, dict[str, Any]], ...]
    enqueued_at: int
    publish_time: int


@dataclass(frozen=True, slots=True)
class Removed(Effect):
    """Forget these messages of queue ``qid``."""

    qid: int
    positions: list[int]


@dataclass(frozen=True, slots=True)
class RemovedRange(Effect):
    """Forget messages ``lo <= position < hi`` of queue ``qid``."""

    qid: int
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class Moved(Effect):
    """Move a message to another queue (dead-lettering), adding ``headers`` (and
    ``defaults`` where it has no header of that name); with ``keep``, copy it, leaving
    the source (a dead letter routed to several queues is copied to all but the last,
    then moved)."""

    src_qid: int
    src_pos: int
    dst_qid: int
    dst_pos: int
    headers: dict[str, Any]
    enqueued_at: int
    keep: bool = False
    defaults: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Acquired(Effect):
    """``consumer`` now holds these messages; ``counts[i]`` is positions[i]'s delivery
    count (failed deliveries so far) and ``acquired[i]`` its acquired count (earlier
    hand-outs)."""

    queue: str
    qid: int
    consumer: str
    positions: list[int]
    counts: list[int]
    acquired: list[int]


@dataclass(frozen=True, slots=True)
class ReadyMore(Effect):
    """The queue's ready count went up (enqueue or release): consumers may get more."""

    queue: str


@dataclass(frozen=True, slots=True)
class QueueGone(Effect):
    """The queue was deleted; its consumers end. ``declarer_left``: the runtime whose
    leaving the view deleted it (a non-durable queue it declared), None for a delete."""

    queue: str
    qid: int
    declarer_left: str | None = None


@dataclass(frozen=True, slots=True)
class OwnerChanged(Effect):
    """``queue`` has a new owner (a member key, or None)."""

    queue: str
    owner: str | None


@dataclass(frozen=True, slots=True)
class MembersChanged(Effect):
    """A view was established (``removed`` left it), or a member's properties changed;
    ``partition``: of that data partition's view, on a log of several (0: the cluster's)."""

    view_seq: int
    members: list[str]
    removed: list[str]
    properties: bool = False
    partition: int = 0


@dataclass(frozen=True, slots=True)
class CheckpointApplied(Effect):
    """A checkpoint was applied at ``offset``; ``digest`` is this replica's state digest
    there. ``expected`` is the leader's digest at ``prev_offset`` and ``mine`` this
    replica's own (None where this replica has none: it joined later)."""

    offset: int
    digest: str
    prev_offset: int
    expected: str
    mine: str | None


@dataclass(frozen=True, slots=True)
class LeaderChanged(Effect):
    """Service ``service`` has a new term: ``leader`` (None: nobody leads now) with
    fencing ``token`` (the granting event's log offset); ``previous`` led before."""

    service: str
    leader: str | None
    token: int
    previous: str | None


@dataclass(frozen=True, slots=True)
class HandoverRequested(Effect):
    """An admin asked ``leader`` (term ``token``) to hand ``service`` over when its
    running work is done; ``to`` is the candidate named to lead next, if any."""

    service: str
    leader: str
    token: int
    to: str | None


@dataclass(frozen=True, slots=True)
class RightsChanged(Effect):
    """User ``user`` was added, deleted, or had its rights or admin flag changed: every
    broker looks again at what that user's sessions hold (its consumers, its service
    candidacies) and ends what the user may no longer have (docs/security.md)."""

    user: str
