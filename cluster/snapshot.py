"""The replicated state's canonical forms: snapshots and the digest (docs/design.md §2, §8).

Pure: no I/O, no clock. Equal states give equal snapshots and equal digests, on every
replica. The *meta snapshot* is the non-queue part (offset, clock, sequence numbers,
ignore counts, membership, services, checkpoints, users); each queue's index has its own
(:meth:`batonmq.cluster.queues.QueueState.snapshot`), and so have the exchanges with
their bindings (:meth:`batonmq.cluster.exchanges.Exchanges.snapshot`), so the node driver
stores only what a batch changed. The *full snapshot* is everything a joining broker installs;
the *digest* is a SHA-256 over all of it that checkpoints compare across replicas.

Snapshots written by older versions (without services, checkpoints, a queue's
reservation, the membership's join keys or exchanges) are still read: the missing parts
restore empty (exchanges: the built-in ones).

Formats (cluster/features.py): while no feature flag is enabled the meta snapshot is the
format-1 list that builds before flags write and read (nine parts; a full snapshot adds
the exchanges as a tenth). Once one is, it has an eleventh part, the feature-flag state
``[format, [[flag, offset], ...]]``, which says the snapshot's format (the tenth is then
None in the stored meta snapshot, which keeps the exchanges apart); once a policy is
set (flag ``policies``), a twelfth part holds the policy table. A reader that finds
a format above its own, or a flag it does not know, refuses it (:func:`check_format`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol

import msgpack

from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.exchanges import Exchanges
from batonmq.cluster.features import MAX_FORMAT, VERSION, Features, snapshot_format
from batonmq.cluster.keys import PublishKeys
from batonmq.cluster.forwarding import Forwards
from batonmq.cluster.groups import ReplicaGroups
from batonmq.cluster.placement import Placement
from batonmq.cluster.membership import Membership
from batonmq.cluster.policies import Policies
from batonmq.cluster.queues import QueueState
from batonmq.cluster.services import Services
from batonmq.cluster.users import Users

__all__ = [
    "Replicated", "meta_snapshot", "restore_meta", "full_snapshot", "digest", "packed_queue",
    "check_format", "FormatUnsupported",
]


class FormatUnsupported(InvalidArgument):
    """A snapshot or a store of a format, or with a feature flag enabled, that this build
    cannot read (a newer build wrote it): refused, never half-read."""


class Replicated(Protocol):
    """The parts of the replicated state that snapshots and the digest cover
    (:class:`batonmq.cluster.state.State` is one)."""

    applied: int
    clock: int
    last_seq: dict[str, int]
    ignored: dict[str, int]
    checkpoints: list[tuple[int, str]]

    @property
    def membership(self) -> Membership: ...

    @property
    def services(self) -> Services: ...

    @property
    def publish_keys(self) -> PublishKeys: ...

    @property
    def users(self) -> Users: ...

    @property
    def exchanges(self) -> Exchanges: ...

    @property
    def features(self) -> Features: ...

    @property
    def placement(self) -> Placement: ...

    @property
    def groups(self) -> ReplicaGroups: ...

    range_tokens: dict[str, int]

    @property
    def forwards(self) -> Forwards: ...

    @property
    def policies(self) -> Policies: ...

    @property
    def queues(self) -> dict[str, QueueState]: ...


def meta_snapshot(r: Replicated) -> list[Any]:
    """The non-queue part of the state, canonical."""
    snap = [
        r.applied,
        r.clock,
        sorted(r.last_seq.items()),
        sorted(r.ignored.items()),
        r.membership.snapshot(),
        # How many publish keys were ever remembered; the keys themselves are
        # stored as they come (take_keys, a block per commit), not with every batch.
        r.publish_keys.total,
        r.services.snapshot(),
        [list(c) for c in r.checkpoints],
        r.users.snapshot(),
    ]
    if r.features.enabled:  # format 2 on (module docstring)
        snap += [None, r.features.snapshot()]
        policies = r.policies.snapshot()
        if policies is not None:  # flag policies, only once one is set (design §15)
            snap.append(policies)
        # A split log's parts (docs/design.md §16), each only when set: the placement
        # map (control) and the fencing tokens seen (a data partition).
        more = [
            r.placement.snapshot() if r.placement else None,
            sorted(r.range_tokens.items()) if r.range_tokens else None,
            r.forwards.snapshot() if r.forwards else None,
            r.groups.snapshot() if r.groups else None,  # (flag replica_groups)
        ]
        while more and more[-1] is None:
            more.pop()
        if more and len(snap) == 11:
            snap.append(None)  # (no policies)
        snap += more
    return snap


def check_format(snap: list[Any]) -> None:
    """Refuse a meta snapshot this build cannot read.

    Raises:
        FormatUnsupported: its format is above this build's, or it has a feature flag
            enabled that this build does not know (a downgrade after enabling it).
    """
    part = snap[10] if len(snap) > 10 else None
    fmt = snapshot_format(part)
    probe = Features()
    probe.restore(part)
    unknown = probe.unknown()
    if fmt > MAX_FORMAT or unknown:
        what = (f"feature flag(s) {', '.join(unknown)} enabled" if unknown
                else f"state of format {fmt}")
        raise FormatUnsupported(
            f"this cluster's state has {what}, which this build (Baton {VERSION}, formats up"
            f" to {MAX_FORMAT}) cannot read: a newer build wrote it, and a downgrade after a"
            " feature flag was enabled is not possible; run the newer build"
        )


def restore_meta(r: Replicated, snap: list[Any]) -> None:
    """Restore the non-queue part of ``r`` from :func:`meta_snapshot`."""
    check_format(snap)
    r.applied, r.clock = snap[0], snap[1]
    r.last_seq = {k: v for k, v in snap[2]}
    r.ignored = {k: v for k, v in snap[3]}
    r.membership.restore(snap[4])
    r.publish_keys.total = snap[5]
    # Snapshots written before service leadership have no services entry.
    r.services.restore(snap[6] if len(snap) > 6 else [])
    r.checkpoints = [(o, d) for o, d in snap[7]] if len(snap) > 7 else []
    # Snapshots written before users, or of a cluster that never had a user event,
    # restore the default table (guest).
    r.users.restore(snap[8] if len(snap) > 8 else None)
    # A full snapshot's meta part carries the exchanges (the stored meta snapshot does
    # not: the store keeps them apart, written only when they change).
    if len(snap) > 9 and snap[9] is not None:
        r.exchanges.restore(snap[9])
    r.features.restore(snap[10] if len(snap) > 10 else None)
    # The policies (flag policies): the queues' effective settings are derived from
    # them again once the queues are restored too (State.apply_policies).
    r.policies.restore(snap[11] if len(snap) > 11 else None)
    r.placement.restore(snap[12] if len(snap) > 12 else None)
    r.range_tokens = {str(k): int(v) for k, v in (snap[13] if len(snap) > 13 and snap[13] else ())}
    r.forwards.restore(snap[14] if len(snap) > 14 else None)
    r.groups.restore(snap[15] if len(snap) > 15 else None)


def full_snapshot(r: Replicated) -> list[Any]:
    """Everything replicated, for a joining broker (docs/design.md §8): the meta snapshot,
    the publish keys and every queue's index (not the messages)."""
    return [
        # The exchanges ride in the meta part, so that the snapshot keeps its shape
        # (and a joiner from before exchanges reads it, leaving them out).
        _with_exchanges(meta_snapshot(r), r.exchanges.snapshot()),
        [list(e) for e in r.publish_keys.entries()],
        [r.queues[name].snapshot() for name in sorted(r.queues)],
    ]


def _with_exchanges(meta: list[Any], exchanges: list[Any]) -> list[Any]:
    """The meta snapshot with the exchanges as its tenth part (before the feature flags'
    from format 2 on)."""
    return meta[:9] + [exchanges] + meta[10:]


def packed_queue(q: QueueState) -> bytes:
    """A queue's part of the digest: its snapshot, packed."""
    return msgpack.packb(q.snapshot(), use_bin_type=True)


def digest(r: Replicated, packed: Callable[[QueueState], bytes] = packed_queue) -> str:
    """SHA-256 over the whole replicated state (hex); equal on replicas of one prefix.

    ``packed`` gives each queue's part (:func:`packed_queue`); a caller may answer it
    from a cache for queues unchanged since it last asked (the bytes must be the same).
    """
    h = hashlib.sha256()
    packer = msgpack.Packer(use_bin_type=True)
    h.update(packer.pack(meta_snapshot(r)))
    h.update(packer.pack(r.exchanges.snapshot()))
    # Publish keys in log order (the order decides what is forgotten first).
    h.update(packer.pack(r.publish_keys.digest_part()))
    for name in sorted(r.queues):
        h.update(packed(r.queues[name]))
    return h.hexdigest()
