"""The replicated state machine: the cluster applied from the ordered log
(docs/design.md §2, §4, §5).

``State.apply(offset, origin, event, out)`` is deterministic: no I/O, no clock, no
randomness. Every broker that applies the same log prefix holds the same state and
the same :meth:`State.digest`. Time enters only through the events' envelopes
(``State.clock`` is the largest envelope time seen, in log order).

:class:`State` is the facade: it drops retried appends and fences events from outside
the established view, dispatches each event, and answers it with a
:class:`~batonmq.cluster.effects.Completed` effect. Its parts live next to it:

* ``cluster/queues.py`` — each queue's index and every message transition, with the
  :data:`TRANSITIONS` table the docs' state diagram is generated from and the
  property test's model (``tests/property/test_state_machine.py``) moves by;
* ``cluster/keys.py`` — the publish-key memory (idempotent publishes);
* ``cluster/snapshot.py`` — the canonical snapshots and the digest;
* ``cluster/effects.py`` — what ``apply`` asks the store and the broker to do;
* ``cluster/membership.py`` and ``cluster/services.py`` — views and service leadership.

Queue ownership (who may acquire, §6), what a member leaving the view releases, and
checkpoints are applied here. What those modules define is importable from here too.
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Container
from typing import Any

from batonmq.cluster import snapshot
from batonmq.cluster.effects import (
    CheckpointApplied, Completed, Effect, HandoverRequested, LeaderChanged, MembersChanged,
    OwnerChanged, RightsChanged,
)
from batonmq.cluster.errors import (
    BatonError, Fenced, InvalidArgument, NotOwner, PreconditionFailed, QueueNotFound, StaleToken,
)
from batonmq.cluster.events import (
    MEMBERSHIP_EVENTS,
    Accept,
    AcceptThrough,
    Acquire,
    AnyEvent,
    Bind,
    BindExchange,
    Checkpoint,
    Candidate,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    DeleteUser,
    EnableFeatures,
    Enqueue,
    FanOut,
    FenceTerm,
    ForwardDone,
    ForwardIn,
    Expire,
    ExpireQueue,
    Handoff,
    Handover,
    Heartbeat,
    Interest,
    Join,
    Leave,
    Origin,
    PlaceQueues, GrowPartitions, ReleaseQueue,  # (placement on control)
    AssignReplicas, AddReplica, ReplicaReady, RemoveReplica, SetReplication,  # (groups)
    Propose,
    PurgeQueue,
    PutUser,
    Reject,
    Release,
    ReleaseAll,
    Reserve,
    Resign,
    RouteDeadLetter,
    RoutedEnqueue,
    SetRights,
    SetUserLimits,
    SetUserTags,
    ClearPolicy,
    SetPolicy,
    Unbind,
    UnbindExchange,
    Vote,
)
from batonmq.cluster.exchanges import Exchanges
from batonmq.cluster.features import FEATURES, Features, announced
from batonmq.cluster.forwarding import Forwards, apply_forward
from batonmq.cluster.keys import KEY_MEMORY, KeyEntry, PublishKeys
from batonmq.cluster.membership import JOIN_KEY_BYTES, VOTER, Membership
from batonmq.cluster.groups import ReplicaGroups
from batonmq.cluster.placement import Placement
from batonmq.cluster.tokens import check_token, fence_term
from batonmq.cluster.policies import Policies
from batonmq.cluster.queues import QueueIndex, QueueState
from batonmq.cluster.results import (
    Candidacy,
    Checkpointed,
    Deleted,
    FeaturesEnabled,
    HandoverAsked,
    Owner,
    Result,
    UserChanged,
)
from batonmq.cluster.services import Grant, Services, check_candidate
from batonmq.cluster.users import User, Users, check_queue_limit, check_user_name

__all__ = ["State"]

_NEEDS_QUEUE_EXPIRY = (
    "queue expiry (expires, AMQP x-expires) needs the feature flag queue_expiry: enable it"
    " with 'baton feature enable queue_expiry' once every broker runs Baton 0.4.0 or later"
)


class State:
    """All replicated state of one cluster, advanced only by :meth:`apply`.

    Args:
        suspect_beats: other members' heartbeats after which a silent one is suspected.
        key_memory: how many publish idempotency keys to remember.
    """

    def __init__(self, suspect_beats: int = 6, key_memory: int = KEY_MEMORY) -> None:
        # Publish idempotency keys (Enqueue.keys), cluster-wide, in log order.
        self.publish_keys = PublishKeys(key_memory)
        self.exchanges = Exchanges()  # exchanges and bindings (cluster/exchanges.py)
        self._exchanges_taken = -1  # the exchanges' version take_exchanges() last gave
        # the queues (cluster/queues.py); dead letters may be routed through exchanges
        self.index = QueueIndex(self, self.publish_keys, self.exchanges)
        self.membership = Membership(suspect_beats)
        self.services = Services()  # service leadership (cluster/services.py)
        self.users = Users()  # users and their rights (cluster/users.py)
        self.features = Features()  # enabled feature flags (cluster/features.py)
        # queue -> data partition, on the control partition (cluster/placement.py)
        self.placement = Placement()
        self.groups = ReplicaGroups()  # data partition -> its brokers (cluster/groups.py)
        # On a data partition of a split log (§16): the highest fencing token seen per service
        # (FenceTerm). ``data_partition``: the node's setting, not replicated (fencing).
        self.range_tokens: dict[str, int] = {}
        # Publishes forwarded between data partitions (cluster/forwarding.py).
        self.forwards = Forwards()
        # Which data partition this state applies: 0 on a log of one and on control.
        self.data_partition = 0
        self.policies = Policies()  # policies (cluster/policies.py, flag policies)
        self.clock = 0  # largest envelope time applied, ms
        self.applied = -1  # offset of the last applied record
        self.last_seq: dict[str, int] = {}  # "node/runtime" -> last applied origin seq
        self.ignored: dict[str, int] = {}  # reason -> count of deterministically ignored events
        self._meta_dirty = True
        # The last two checkpoints applied: (offset, this replica's digest there).
        self.checkpoints: list[tuple[int, str]] = []
        # The digest's part of each queue as last computed (the queue, its packed
        # snapshot), and those of them changed since (taken from ``dirty`` before each
        # take_dirty() clears it): a checkpoint packs only what changed, not the state.
        self._packed: dict[str, tuple[QueueState, bytes]] = {}
        self._changed: set[str] = set()

    @property
    def queues(self) -> dict[str, QueueState]:
        """Every queue's index, by name."""
        return self.index.queues

    @queues.setter
    def queues(self, queues: dict[str, QueueState]) -> None:
        self.index.queues = queues

    @property
    def dirty(self) -> set[str]:
        """Queues changed since the last :meth:`take_dirty`."""
        return self.index.dirty

    @dirty.setter
    def dirty(self, names: set[str]) -> None:
        self.index.dirty = names

    @property
    def keys(self) -> dict[tuple[int, str], tuple[int, int]]:
        """The remembered publish keys: (qid, key) -> (the first position it got, when
        it is forgotten: replicated ms, -1 never)."""
        return self.publish_keys.known

    @property
    def key_memory(self) -> int:
        """How many publish keys are remembered (0: publishes are not deduplicated)."""
        return self.publish_keys.memory

    @key_memory.setter
    def key_memory(self, n: int) -> None:
        self.publish_keys.memory = n

    # -- driving ------------------------------------------------------------------

    def apply(self, offset: int, origin: Origin, event: AnyEvent, out: list[Effect]) -> None:
        """Apply one event at log ``offset``, appending its effects to ``out``."""
        flagless = self.flagless_runtime() if type(event) is EnableFeatures else None
        if flagless is not None:
            # A live runtime of a build from before feature flags cannot decode this
            # record and skips it as malformed: every replica does the same, so that
            # the replicas' states stay equal (cluster/features.py).
            self.skip_malformed(offset)
            out.append(Completed(origin.node, origin.runtime, origin.seq, None, InvalidArgument(
                f"runtime {flagless} of a build from before feature flags is live: no flag"
                " can be enabled until it is upgraded"
            )))
            return
        self.applied = offset
        self._meta_dirty = True
        key = f"{origin.node}/{origin.runtime}"
        last = self.last_seq.get(key, -1)
        if origin.seq <= last:
            self.ignore("duplicate")  # a retried append: applied once (docs/design.md §3)
            return
        self.last_seq[key] = origin.seq
        if origin.ts > self.clock:
            self.clock = origin.ts
        result: Result | None
        try:
            if isinstance(event, MEMBERSHIP_EVENTS):
                self._membership_event(key, origin, event, out)
                result = None  # membership events answer nothing
            elif key not in self.membership.member_set:
                # Fencing (docs/design.md §4): only members of the established view act.
                self.ignore("fenced")
                raise Fenced(f"{key} is not in the established view {self.membership.view_seq}")
            else:
                result = self._dispatch(key, origin, event, out)
        except BatonError as exc:
            out.append(Completed(origin.node, origin.runtime, origin.seq, None, exc))
            return
        out.append(Completed(origin.node, origin.runtime, origin.seq, result))

    def skip_malformed(self, offset: int, *, unopened: bool = False) -> None:
        """Count a record that could not be decoded (``malformed``), or that a sealed
        log could not open (``unopened``), the same on every replica."""
        self.applied = offset
        self._meta_dirty = True
        if unopened:
            self.ignore("unopened")
        else:
            self.ignore("malformed")

    def ignore(self, reason: str, n: int = 1) -> None:
        """Count ``n`` events (or parts of one) ignored, deterministically, for ``reason``."""
        self.ignored[reason] = self.ignored.get(reason, 0) + n

    def _dispatch(
        self, key: str, origin: Origin, ev: AnyEvent, out: list[Effect]
    ) -> Result | None:
        # Ordered by frequency on the hot path.
        match ev:
            case Enqueue() | RoutedEnqueue():
                if ev.ttls:  # (written only once the flag is on; a forged one is refused)
                    self._need("message_ttl", "a message's own TTL needs")
                if isinstance(ev, Enqueue):
                    return self.index.enqueue(origin, ev, out)
                return self.index.enqueue_routed(origin, ev, out)
            case Acquire():
                return self.index.acquire(key, ev, out)
            case Accept():
                self._own_consumer(key, ev.consumer)
                return self.index.accept(ev, out)
            case Release():
                self._own_consumer(key, ev.consumer)
                return self.index.release(
                    ev.queue, ev.consumer, ev.positions, out, ev.failed, ev.delay_ms, ev.timed_out
                )
            case Reject():
                self._own_consumer(key, ev.consumer)
                return self.index.reject(ev, out)
            case ReleaseAll():
                self._own_consumer(key, ev.consumer)
                return self.index.release_all(ev, out)
            case Expire():
                return self.index.expire(ev, out)
            case AcceptThrough():
                self._fence_range(ev)
                return self.index.accept_through(ev, out)
            case Reserve():
                self._fence_range(ev)
                return self.index.reserve(ev, out)
            case Interest():
                return self._interest(key, ev, out)
            case Handoff():
                return self._handoff(key, ev, out)
            case DeclareQueue():
                if ev.expires_ms is not None and "queue_expiry" not in self.features.enabled:
                    # Written only once the flag is on; a forged one is refused alike.
                    raise InvalidArgument(_NEEDS_QUEUE_EXPIRY)
                if ev.user is not None and "user_limits" in self.features.enabled:
                    check_queue_limit(self.users, self.queues, ev.queue, ev.user, self.ignore)
                elif ev.user is not None:  # not counted before the flag (none is written)
                    ev = replace(ev, user=None)
                declared = self.index.declare(key, ev)
                if declared.created and len(self.policies):
                    self.policies.apply(self.queues[ev.queue])  # a policy matching it
                return declared
            case DeleteQueue():
                return self._delete_queue(ev.queue, out)
            case ExpireQueue():
                return self._expire_queue(ev, out)
            case DeclareExchange():
                return self.exchanges.declare(key, ev)
            case DeleteExchange():
                return self.exchanges.delete(ev)
            case Bind():
                return self.exchanges.bind(ev, self._bindable())
            case Unbind():
                return self.exchanges.unbind(ev, self._bindable())
            case BindExchange() | UnbindExchange():
                self._need("exchange_bindings", "exchange-to-exchange bindings need")
                if isinstance(ev, BindExchange):
                    return self.exchanges.bind_exchange(ev)
                return self.exchanges.unbind_exchange(ev)
            case PurgeQueue():
                return self.index.purge(ev, out)
            case Checkpoint():
                return self._checkpoint(key, ev, out)
            case Candidate() | Resign():
                return self._candidacy(key, ev, out)
            case Handover():
                return self._handover(ev, out)
            case PutUser() | DeleteUser() | SetRights():
                return self._user_event(ev, out)
            case SetUserLimits() | SetUserTags():
                self._need("user_limits", "user limits and tags need")
                return self._user_event(ev, out)
            case SetPolicy() | ClearPolicy():
                self._need("policies", "policies need")
                return self.policies.apply_event(ev, self.queues.values())
            case EnableFeatures():
                return self._enable_features(ev)
            case PlaceQueues() | ReleaseQueue() | GrowPartitions():  # (docs/design.md §16)
                self._need("partitions", f"{type(ev).__name__} needs")
                if isinstance(ev, ReleaseQueue) or getattr(ev, "user", None) is not None:
                    self._need("user_limits", "a user's queues on a split log need")
                return self.placement.apply(ev, self.users, self.ignore)
            case (AssignReplicas() | AddReplica() | ReplicaReady() | RemoveReplica()
                  | SetReplication()):
                self._need("replica_groups", f"{type(ev).__name__} needs")
                return self.groups.apply(ev, self.ignore)
            case FanOut() | ForwardIn() | ForwardDone() | RouteDeadLetter():
                self._need("partitions", f"{type(ev).__name__} needs")
                if isinstance(ev, (FanOut, ForwardIn)) and ev.ttls:  # (as for an Enqueue)
                    self._need("message_ttl", "a message's own TTL needs")
                # A publish forwarded between data partitions (cluster/forwarding.py).
                return apply_forward(self.forwards, self.index, self.ignore,
                                     self.data_partition, origin, ev, out)
            case FenceTerm():
                self._need("partitions", "FenceTerm needs")
                fence_term(self.range_tokens, ev.service, ev.token)
                return None
        raise InvalidArgument(f"event {type(ev).__name__} is not applicable")

    def _need(self, flag: str, what: str) -> None:
        """A flag's events are written once it is on; before, one is refused alike."""
        if flag not in self.features.enabled:
            raise InvalidArgument(f"{what} the feature flag {flag}")

    def _bindable(self) -> Container[str]:
        """The queues a binding may name: this state's, or on control, the placed (§16)."""
        return self.placement if len(self.placement) else self.queues

    def _delete_queue(
        self, name: str, out: list[Effect], declarer_left: str | None = None
    ) -> Deleted:
        """Delete a queue, and its bindings with it."""
        done = self.index.delete(name, out, declarer_left)
        self.exchanges.queue_deleted(name)
        return done

    def _expire_queue(self, ev: ExpireQueue, out: list[Effect]) -> Deleted:
        """Delete a queue that expired (docs/events.md "Queue expiry"), decided here by
        the replicated clock and the queue's replicated last use, never by the appender's
        clock: a late or repeated ExpireQueue, or one for a queue used (or declared anew)
        since it was appended, is ignored alike on every replica.

        Raises:
            InvalidArgument: the flag queue_expiry is not enabled.
            QueueNotFound: no such queue (deleted already).
            PreconditionFailed: the queue does not expire, or not yet.
        """
        if "queue_expiry" not in self.features.enabled:
            raise InvalidArgument(_NEEDS_QUEUE_EXPIRY)
        q = self.queues.get(ev.queue)
        if q is None:
            self.ignore("not-expired")
            raise QueueNotFound(f"queue {ev.queue!r} does not exist")
        if not q.unused_past_expiry(self.clock):
            self.ignore("not-expired")
            raise PreconditionFailed(f"queue {ev.queue!r} is in use or not expired yet")
        return self._delete_queue(ev.queue, out)

    def _own_consumer(self, key: str, consumer: str) -> None:
        """Only a consumer's own broker settles its messages.

        Raises:
            InvalidArgument: ``consumer`` is not one of ``key``'s.
        """
        if not consumer.startswith(key + "/"):
            self.ignore("not-own-consumer")
            raise InvalidArgument(f"{key} cannot settle for consumer {consumer}")

    # -- ownership (docs/design.md §6) ---------------------------------------------------------

    def _next_interested(self, q: QueueState, after: str | None) -> str | None:
        """The next interested member after ``after`` in view order (cyclic), not it; for
        a single-active-consumer queue the first interested one, in interest order."""
        if q.single_active_consumer:
            return next((m for m in q.interested if m != after), None)
        order = [m for m in self.membership.members if m in q.interested and m != after]
        if not order:
            return None
        if after in self.membership.members:
            pos = self.membership.members.index(after)
            later = [m for m in order if self.membership.members.index(m) > pos]
            if later:
                return later[0]
        return order[0]

    def _set_owner(self, q: QueueState, owner: str | None, out: list[Effect]) -> None:
        if q.owner != owner:
            q.owner = owner
            out.append(OwnerChanged(q.name, owner))

    def _interest(self, key: str, ev: Interest, out: list[Effect]) -> Owner:
        q = self.index.queue(ev.queue)
        if ev.on:
            if key not in q.interested:
                q.interested.append(key)
            if q.owner is None:
                self._set_owner(q, key, out)
        else:
            if key in q.interested:
                q.interested.remove(key)
            if q.owner == key:
                self._set_owner(q, self._next_interested(q, key), out)
        if q.expires_ms is not None:
            q.used_at = self.clock  # consumers came or went: a use (queue expiry)
        return Owner(q.owner)

    def _handoff(self, key: str, ev: Handoff, out: list[Effect]) -> Owner:
        q = self.index.queue(ev.queue)
        if q.owner != key:
            self.ignore("not-owner")
            raise NotOwner(f"{key} does not own queue {q.name!r}")
        if q.single_active_consumer:
            return Owner(q.owner)  # its active consumer keeps it: no time slices
        to = ev.to if ev.to in q.interested and ev.to != key else self._next_interested(q, key)
        if to is not None:
            self._set_owner(q, to, out)
        return Owner(q.owner)

    # -- feature flags (cluster/features.py, docs/design.md §15) --------------------------------

    def live_runtimes(self) -> list[str]:
        """The runtimes a flag must be supported by: the view's members and every
        runtime that beats and is neither suspected nor refused, in a stable order."""
        ms = self.membership
        out = list(ms.members)
        out += [k for k in ms.beat_order
                if k not in ms.member_set and k not in ms.refused and not ms.suspected(k)]
        return out

    def supported(self, key: str) -> frozenset[str] | None:
        """The flags a runtime announces in its heartbeats (None: none, an older build;
        or no heartbeat of it applied yet)."""
        m = self.membership.known.get(key)
        return None if m is None else announced(m.properties)

    def flagless_runtime(self) -> str | None:
        """A live runtime that announces no feature flags at all, if there is one."""
        return next((k for k in self.live_runtimes() if self.supported(k) is None), None)

    def _enable_features(self, ev: EnableFeatures) -> FeaturesEnabled:
        """Enable flags, all or none: each must be announced by every live runtime (a
        runtime that lacks one could not read what the flag changes).

        The rule does not depend on knowing a flag, so replicas of every build decide
        alike; a replica whose build does not know a flag that this rule enables never
        gets here (:meth:`enables_unknown`: its applier stops before the record).
        """
        new = [n for n in dict.fromkeys(ev.names) if n not in self.features.enabled]
        for key in self.live_runtimes():
            lacking = [n for n in new if n not in (self.supported(key) or ())]
            if lacking:
                self.ignore("unsupported-feature")
                raise InvalidArgument(
                    f"member {key} does not support feature flag(s) {', '.join(lacking)}:"
                    " upgrade it first"
                )
        for name in new:
            self.features.enabled[name] = self.applied
        return FeaturesEnabled(enabled=new, format=self.features.format)

    def enables_unknown(self, ev: EnableFeatures, origin: Origin) -> list[str]:
        """The flags unknown to this build that applying ``ev`` would enable (every live
        runtime announces them: a newer build's cluster, which this replica cannot
        follow); empty when it would not enable any."""
        unknown = [n for n in ev.names if n not in FEATURES and n not in self.features.enabled]
        if not unknown or f"{origin.node}/{origin.runtime}" not in self.membership.member_set:
            return []
        if origin.seq <= self.last_seq.get(f"{origin.node}/{origin.runtime}", -1):
            return []  # a duplicate: skipped anyway
        if self.flagless_runtime() is not None:
            return []
        live = self.live_runtimes()
        if all(n in (self.supported(k) or ()) for k in live for n in ev.names):
            return unknown
        return []

    # -- users (cluster/users.py, docs/security.md) -------------------------------------------

    def _user_event(
        self, ev: PutUser | DeleteUser | SetRights | SetUserLimits | SetUserTags,
        out: list[Effect],
    ) -> UserChanged:
        users = self.users
        match ev:
            case PutUser():
                try:
                    check_user_name(ev.name)
                    user = User(ev.name, ev.salt, ev.cost, ev.stored_key, ev.server_key, ev.admin)
                except InvalidArgument:
                    self.ignore("bad-user")
                    raise
                if ev.initial:
                    user = replace(user, admin=True)
                changed = users.put(user, initial=ev.initial)
            case DeleteUser():
                changed = users.delete(ev.name)
            case SetRights():
                users.set_rights(ev.name, dict(ev.rights))
                changed = True
            case SetUserLimits():
                users.set_limits(ev.name, dict(ev.limits))
                changed = True
            case SetUserTags():
                users.set_tags(ev.name, ev.tags)
                changed = True
        # Every broker then ends what the user may no longer have: its consumers, its
        # candidacies, its connections once deleted (docs/security.md, revoking).
        out.append(RightsChanged(ev.name))
        return UserChanged(changed)

    # -- service leadership (docs/design.md §7, cluster/services.py) ----------------------------

    def _handover(self, ev: Handover, out: list[Effect]) -> HandoverAsked:
        leader, token, to = self.services.handover(ev.service, ev.to, self.applied)
        out.append(HandoverRequested(ev.service, leader, token, to))
        return HandoverAsked(service=ev.service, leader=leader, token=token, to=to)

    def _candidacy(self, key: str, ev: Candidate | Resign, out: list[Effect]) -> Candidacy:
        services = self.services
        try:
            check_candidate(key, ev.service, ev.candidate)
        except InvalidArgument:
            self.ignore("not-own-candidate")  # a broker acts only for its own sessions
            raise
        if isinstance(ev, Candidate):
            grant = services.candidate(ev.service, ev.candidate, self.applied)
            was = True
        else:
            was, grant = services.resign(ev.service, ev.candidate, self.applied)
        if grant is not None:
            self._granted(grant, out)
        s = services.get(ev.service)
        return Candidacy(
            service=ev.service,
            candidate=ev.candidate,
            was_candidate=was,
            leader=None if s is None else s.leader,
            token=None if s is None or s.leader is None else s.token,
        )

    def _fence_range(self, ev: Reserve | AcceptThrough) -> None:
        """A range commit fenced by a service's term acts only while that term is
        current (docs/spark.md, "Fencing"); an unfenced one (no service) always may.

        Raises:
            InvalidArgument: a token without a service, or a negative token.
            StaleToken: the term is over (counted ``stale-token``).
        """
        if not ev.service:
            if ev.token != -1:
                raise InvalidArgument("a fencing token needs the service it belongs to")
            return
        if self.data_partition:  # the terms are on control (cluster/tokens.py)
            check_token(self.range_tokens, ev.service, ev.token, self.ignore)
            return
        try:
            self.services.check_token(ev.service, ev.token)
        except StaleToken:
            self.ignore("stale-token")
            raise

    def _granted(self, g: Grant, out: list[Effect]) -> None:
        out.append(LeaderChanged(g.service, g.leader, g.token, g.previous))

    # -- membership (docs/design.md §7) ---------------------------------------------------------

    def _membership_event(
        self, key: str, origin: Origin, ev: Heartbeat | Propose | Vote | Leave | Join,
        out: list[Effect],
    ) -> None:
        ms = self.membership
        match ev:
            case Heartbeat():
                if ev.role not in (VOTER, "observer"):
                    raise InvalidArgument(f"unknown role {ev.role!r}")
                if ms.heartbeat(
                    key, origin.node, origin.runtime, ev.role, ev.address, ev.properties, ev.hold
                ):
                    out.append(MembersChanged(ms.view_seq, list(ms.members), [], properties=True))
                if self.features.enabled and key not in ms.refused and key not in ms.member_set:
                    # A build that lacks an enabled flag cannot read what it changed: it
                    # never becomes a member (cluster/features.py).
                    why = self.features.refusal(announced(ev.properties))
                    if why is not None:
                        ms.refused[key] = why
            case Leave():
                ms.leave(key)
            case Join():
                # A marker: the update is captured at or after it (docs/design.md §8). Its
                # key is what the joiner proves itself with (cluster/member_proof.py).
                if ev.member_key:
                    if len(ev.member_key) != JOIN_KEY_BYTES:
                        raise InvalidArgument(
                            f"Join.member_key must be {JOIN_KEY_BYTES} bytes (an Ed25519"
                            f" public key), not {len(ev.member_key)}"
                        )
                    ms.join(key, ev.member_key)
            case Propose():
                why = ms.propose(key, ev.view_seq, list(ev.members), ev.cluster_id)
                if why is not None:
                    self.ignore("bad-proposal")
                    raise InvalidArgument(why)
            case Vote():
                established = ms.vote(key, ev.view_seq, ev.yes)
                if established is not None:
                    members, removed = established
                    for gone in removed:
                        self._drop_member(gone, out)
                    out.append(MembersChanged(
                        ms.view_seq, members, removed, partition=self.data_partition
                    ))

    def _drop_member(self, key: str, out: list[Effect]) -> None:
        """A runtime left the view: what its consumers held goes back (guarantee 6),
        its queues pass on, and the non-durable queues it declared are deleted."""
        prefix = key + "/"
        for name in sorted(self.queues):
            q = self.queues[name]
            if not q.durable and q.declared_by == key:
                self._delete_queue(name, out, declarer_left=key)
                continue
            by_consumer: dict[str, list[int]] = {}
            for p, c in q.acquired.items():
                if c.startswith(prefix):
                    by_consumer.setdefault(c, []).append(p)
            for consumer in sorted(by_consumer):
                self.index.release(name, consumer, sorted(by_consumer[consumer]), out)
            if key in q.interested:
                q.interested.remove(key)
                if q.expires_ms is not None:
                    q.used_at = self.clock  # its consumers went: a use (queue expiry)
                self.dirty.add(name)
            if q.owner == key:
                self._set_owner(q, self._next_interested(q, key), out)
                self.dirty.add(name)
        self.exchanges.member_left(key)
        # Its broker-level and session candidacies go; a service it led gets a new
        # term at this log position (docs/design.md §7).
        for grant in self.services.drop_member(key, self.applied, self.membership.member_set):
            self._granted(grant, out)

    # -- checkpoints (docs/design.md §8) ------------------------------------------------------

    def _checkpoint(self, key: str, ev: Checkpoint, out: list[Effect]) -> Checkpointed:
        if key != self.membership.leader():
            self.ignore("not-leader")
            raise InvalidArgument(f"{key} is not the leader; only the leader checkpoints")
        mine = next((d for o, d in self.checkpoints if o == ev.prev_offset), None)
        # The digest of the state with this event applied (its seq counted, the
        # earlier checkpoints in it), before this checkpoint is recorded.
        digest = self.digest()
        self.checkpoints = (self.checkpoints + [(self.applied, digest)])[-2:]
        out.append(CheckpointApplied(self.applied, digest, ev.prev_offset, ev.prev_digest, mine))
        return Checkpointed(offset=self.applied, digest=digest)


    # -- persistence and digests (cluster/snapshot.py) ---------------------------------

    def meta_snapshot(self) -> list[Any]:
        """The non-queue part of the state, canonical."""
        return snapshot.meta_snapshot(self)

    def restore_meta(self, snap: list[Any]) -> None:
        """Restore the non-queue part from :meth:`meta_snapshot`."""
        snapshot.restore_meta(self, snap)

    def full_snapshot(self) -> list[Any]:
        """Everything replicated, for a joining broker (docs/design.md §8): the meta snapshot,
        the publish keys and every queue's index (not the messages)."""
        return snapshot.full_snapshot(self)

    def install(self, snap: list[Any]) -> None:
        """Replace this (empty) state by a :meth:`full_snapshot` taken elsewhere.
        Everything is marked dirty, so the next take_dirty()/take_keys() write it all."""
        meta, keys, queues = snap
        self.restore_meta(meta)
        self.publish_keys.install(
            [(e[0], e[1], e[2], e[3], e[4] if len(e) > 4 else -1) for e in keys]
        )
        self.queues = {}
        for qsnap in queues:
            q = QueueState.restore(qsnap)
            self.queues[q.name] = q
        self.apply_policies()
        self.dirty = set(self.queues)
        self._meta_dirty = True

    def apply_policies(self) -> None:
        """Derive every queue's effective settings from the policies again (after the
        queues and the meta snapshot are restored: a queue's snapshot keeps its declared
        settings)."""
        if len(self.policies):
            self.policies.apply_all(self.queues.values())

    def key_entries(self) -> list[KeyEntry]:
        """The remembered publish keys as (seq, qid, key, first position, expires), in log
        order."""
        return self.publish_keys.entries()

    def restore_keys(self, entries: list[KeyEntry]) -> None:
        """Restore the key memory from :meth:`key_entries` (after :meth:`restore_meta`)."""
        self.publish_keys.restore(entries)

    def keys_floor(self) -> int:
        """The sequence number of the oldest publish key still remembered."""
        return self.publish_keys.floor()

    def take_keys(self) -> tuple[list[KeyEntry], int]:
        """Keys remembered since the last call, and the sequence number below which keys
        are forgotten. The driver stores them with the batch's offset."""
        return self.publish_keys.take()

    def take_dirty(self) -> tuple[list[Any] | None, dict[str, list[Any] | None]]:
        """Snapshots of what changed since the last call: (meta or None, {queue: snap or None
        if deleted}). The driver writes them with the batch's offset."""
        meta = self.meta_snapshot() if self._meta_dirty else None
        queues = {
            name: (self.queues[name].snapshot() if name in self.queues else None)
            for name in self.dirty
        }
        if self._packed:  # (only what the last digest packed can be stale)
            packed = self._packed
            self._changed.update(name for name in self.dirty if name in packed)
        self.dirty = set()
        self._meta_dirty = False
        return meta, queues

    def take_exchanges(self) -> list[Any] | None:
        """The exchanges' snapshot if they changed since the last call (None if not).
        The driver stores it with the batch's offset, apart from the meta snapshot,
        which is written with every batch."""
        ex = self.exchanges
        if ex.version == self._exchanges_taken:
            return None
        self._exchanges_taken = ex.version
        return ex.snapshot()

    def digest(self) -> str:
        """SHA-256 over the whole replicated state (hex); equal on replicas of one prefix.

        The same bytes as :func:`batonmq.cluster.snapshot.digest` hashes, but a queue
        unchanged since the last digest (not marked dirty, the same object) is not
        packed again: its bytes from then are hashed.
        """
        changed = self._changed | self.dirty
        self._changed = set()
        old, fresh = self._packed, {}

        def packed(q: QueueState) -> bytes:
            hit = old.get(q.name)
            if hit is None or hit[0] is not q or q.name in changed:
                hit = (q, snapshot.packed_queue(q))
            fresh[q.name] = hit
            return hit[1]

        value = snapshot.digest(self, packed)
        self._packed = fresh  # deleted queues drop out
        return value
