"""A broker's replica of a cluster whose log is a control partition and N data
partitions (docs/design.md §16).

:class:`Partitioned` is the :class:`~batonmq.cluster.node.Node` of the control
partition (physical partition 0: membership, users and rights, feature flags,
exchanges and bindings, service leadership and the placement map), and it holds one
more node per data partition ``1..N`` (physical partition ``k``), each an
independent replica of that partition alone: its own state, store, reader and
applier, appends, heartbeats and view (its members fence its acquires), checkpoints,
retention and join update. Every node of one broker process has the same runtime id,
so a consumer, an owner and a member are named alike on every partition.

To the broker it is one node: :attr:`queues` reads every data partition's queues,
:meth:`part` names the node of a queue, and :meth:`submit` sends each event to the
partition it belongs to — a queue's events to the queue's data partition, everything
else to control; a declare places the queue on control first (its dead-letter queue
with it, and a user's new queue counted there), and a publish through an exchange over
several data partitions is one FanOut on the first, forwarded to the others.

As the leader of a data partition it forwards that partition's entries for others
(cluster/forwarding.py): its publishes, and its dead letters for queues elsewhere, which
it routes first (RouteDeadLetter) by the placement map and the bindings it applied.

Growing N (cluster/growth.py): when control applies a GrowPartitions, the broker opens
the new partitions and starts a node for each, which joins :attr:`Partitioned.data`
once it is a member of its partition's view.

Replica groups (cluster/replication.py, flag ``replica_groups``): the broker applies only
the data partitions whose group it is in; an event for a queue of another partition goes
to that partition's replicas through :attr:`Partitioned.remote` (set by the broker).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, cast

from batonmq.cluster.appender import R, ignore_outcome
from batonmq.cluster.applier import EffectListener
from batonmq.cluster.effects import Effect, LeaderChanged, QueueGone
from batonmq.cluster.errors import BatonError, InvalidArgument, LogUnavailable, QueueNotFound
from batonmq.cluster.events import (
    AcceptThrough,
    Bind,
    ClearPolicy,
    DeclareQueue,
    EnableFeatures,
    Event,
    FanOut,
    FenceTerm,
    ForwardDone,
    ForwardIn,
    GrowPartitions,
    PlaceQueues,
    ReleaseQueue,
    Reserve,
    RouteDeadLetter,
    RoutedEnqueue,
    SetPolicy,
    Unbind,
)
from batonmq.cluster.forwarding import OUTBOX_QID, DeadLetter, ForwardGap
from batonmq.cluster.growth import Growth, lacking
from batonmq.cluster.log import LogSet
from batonmq.cluster.node import Node
from batonmq.cluster.queues import QueueState
from batonmq.cluster.replication import Replication
from batonmq.cluster.results import Placed, PolicyChanged, Routed
from batonmq.cluster.state import State
from batonmq.store import Store

__all__ = ["Partitioned"]

log = logging.getLogger("baton.node")



#: Events that name a queue but belong to the control partition (bindings are
#: with the exchanges).
_CONTROL_QUEUE_EVENTS = (Bind, Unbind)

#: Events that every partition applies: feature flags (each partition's state writes and
#: reads by its own), and policies (a queue's effective settings are its partition's).
_EVERYWHERE = (EnableFeatures, SetPolicy, ClearPolicy)

#: How often a data partition's leader compares its flags and policies with control's.
FOLLOW_INTERVAL = 1.0


class _Queues(Mapping[str, QueueState]):
    """Every data partition's queues, read through the placement map."""

    def __init__(self, owner: "Partitioned") -> None:
        self._owner = owner

    def __getitem__(self, name: str) -> QueueState:
        return self._owner.part(name).state.queues[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._owner.part(name).state.queues

    def __iter__(self) -> Iterator[str]:
        for node in self._owner.data.values():
            yield from node.state.queues

    def __len__(self) -> int:
        return sum(len(node.state.queues) for node in self._owner.data.values())


class Partitioned(Node):
    """The control partition's node, with a node per data partition.

    Args:
        node_id: this broker's persistent id.
        logs: the log set: partition 0 control, ``1..count-1`` data.
        store: the control partition's store.
        stores: each data partition's store, by partition.
        **options: as for :class:`Node`, given to every partition's node.
    """

    def __init__(
        self, node_id: str, logs: LogSet, store: Store, stores: dict[int, Store], **options: Any
    ) -> None:
        if logs.count < 2:
            raise InvalidArgument("a partitioned node needs a log of two partitions or more")
        self.data: dict[int, Node] = {}
        self._listener: EffectListener | None = None
        self._forwarding: set[tuple[int, int]] = set()  # (home, target) being forwarded
        #: The last origin number this runtime used on each data partition it closed.
        self.closed_seqs: dict[int, int] = {}
        super().__init__(node_id, logs.partition(0), store, partition=0, **options)
        self.logs = logs
        self._options = options
        self._opened = logs.count - 1  # data partitions the log had when this node began
        #: Opens data partition k's store (set by the broker; growing N needs it).
        self.open_store: Callable[[int], Store] | None = None
        for k in range(1, logs.count):
            self.data[k] = self.new_data_node(k, stores[k])
        self._queues = _Queues(self)
        self.growth = Growth(self)
        self.replication = Replication(self)
        #: Sends an event of a data partition this broker does not apply to one of its
        #: replicas, and answers what applying it answered there (set by the broker).
        self.remote: Callable[[int, Event[Any]], Awaitable[Any]] | None = None

    @property
    def count(self) -> int:
        """How many data partitions the cluster has: the count a GrowPartitions recorded
        on control, else (never grown) the log's when this node began."""
        return self.state.placement.partitions or self._opened

    def new_data_node(self, k: int, store: Store) -> Node:
        """A node for data partition ``k`` (of :attr:`logs`), wired to this one: not
        started, not in :attr:`data` yet."""
        node = Node(
            self.node_id, self.logs.partition(k), store, runtime_id=self.runtime_id,
            partition=k, **self._options,
        )
        # A partition this runtime left and is given again: its numbers go on.
        node.appender.continue_after(self.closed_seqs.get(k, 0))
        node.on_unlocked = self._data_unlocked
        node.on_truncated = self._data_truncated
        node.state.data_partition = k  # (its tokens and forwarded publishes)
        # Dead letters for queues elsewhere wait in its outbox (cluster/forwarding.py).
        node.state.index.away = node.state.forwards
        if self._listener is not None:
            node.listener = self._data_effects(k)
        return node

    # -- what the broker reads ---------------------------------------------------------

    @property
    def queues(self) -> Mapping[str, QueueState]:
        return self._queues

    def part(self, queue: str) -> Node:
        """The data partition's node that applies ``queue`` (by the placement map; a
        queue declared on a data partition before its placement is applied here is
        found there too), else this control node (which has no queues)."""
        k = self.state.placement.get(queue)
        if k is not None and k in self.data:
            return self.data[k]
        for node in self.data.values():
            if queue in node.state.queues:
                return node
        return self

    def parts(self) -> list[Node]:
        """Control's node, then each data partition's applied here, in partition order."""
        return [self, *(self.data[k] for k in sorted(self.data))]

    def wanted(self) -> set[int]:
        """The data partitions this broker should apply (cluster/replication.py), less
        those it is closing."""
        return self.replication.wanted() - self.replication.closing

    def replicates(self, k: int) -> bool:
        """Whether this broker applies data partition ``k``."""
        return k in self.data

    def replica_addresses(self, k: int) -> list[str]:
        """Client addresses of the live brokers that serve data partition ``k``."""
        return self.replication.addresses(k)

    def locate(self, queue: str, visible: bool = True) -> dict[str, Any]:
        """Where a client sends ``queue``'s commands (the Locate frame; docs/design.md
        §16, "Clients route to replicas"): its data partition (0: not placed, or not
        ``visible`` to the asking user), whether the connection asking does
        (``anywhere``: every broker applies it, or this one is a caught-up replica),
        else the client addresses of its live caught-up replicas; and whether the
        cluster has replica groups at all (``groups``)."""
        groups = self.replication.active
        k = self.state.placement.get(queue) if visible else None
        g = self.replication.group(k) if k is not None and groups else None
        here = k in self.data and g is not None and self.node_id in g.replicas
        if k is None or not groups or here:
            return {"partition": k or 0, "anywhere": True, "addresses": [], "groups": groups}
        return {"partition": k, "anywhere": False, "addresses": self.replica_addresses(k),
                "groups": True}

    def _elsewhere(self, queue: str) -> int:
        """The data partition ``queue`` is placed on when this broker does not apply it
        (replica groups), else 0."""
        k = self.state.placement.get(queue)
        if k is None or k in self.data or not self.replication.active:
            return 0
        return k

    def submit_to(self, k: int, event: Event[R]) -> asyncio.Future[R]:
        """Append ``event`` to data partition ``k``: here if this broker applies it,
        else through one of its replicas (:attr:`remote`)."""
        node = self.data.get(k)
        if node is not None:
            return node.submit(event)
        return cast("asyncio.Future[R]", asyncio.ensure_future(self._remote(k, event)))

    async def _remote(self, k: int, event: Event[Any]) -> Any:
        if self.remote is None:
            where = ", ".join(self.replica_addresses(k)) or "none live"
            raise LogUnavailable(
                f"data partition {k} is not applied by this broker (replica groups), and"
                f" it cannot forward to its replicas ({where})"
            )
        return await self.remote(k, event)

    def partition_node(self, partition: int) -> Node | None:
        return self if partition == 0 else self.data.get(partition)

    def locked(self, queue: str) -> bool:
        node = self.part(queue)
        return Node.locked(node, queue) if node is self else node.locked(queue)

    @property
    def healthy(self) -> bool:
        return self.health.ok and all(n.health.ok for n in self.data.values())

    @healthy.setter
    def healthy(self, ok: bool) -> None:
        self.health.ok = ok

    @property
    def listener(self) -> EffectListener | None:
        return self._listener

    @listener.setter
    def listener(self, listener: EffectListener | None) -> None:
        self._listener = listener
        self.applier.listener = self._control_effects
        for k, node in self.data.items():
            node.listener = self._data_effects(k)

    def _control_effects(self, effects: list[Effect]) -> None:
        """The control partition's effects, to the broker; and each service term granted
        goes to every data partition (FenceTerm; every broker appends it, the first one
        applied there counts), so that a deposed term's range commits are refused there
        too, in that partition's log order."""
        for e in effects:
            if isinstance(e, LeaderChanged) and e.leader is not None:
                for node in self.data.values():
                    node.submit(FenceTerm(e.service, e.token)).add_done_callback(ignore_outcome)
        if self._listener is not None:
            self._listener(effects)
        self.growth.check()  # a GrowPartitions applied: open the new partitions
        self.replication.check()  # groups changed: open or close partitions here

    @property
    def serving(self) -> bool:
        return self._serving

    @serving.setter
    def serving(self, on: bool) -> None:
        self._serving = on
        for node in self.data.values():  # (set before Node.__init__ sets this)
            node.serving = on

    def _data_unlocked(self, queue: str) -> None:
        if self.on_unlocked is not None:
            self.on_unlocked(queue)

    def _data_truncated(self) -> None:
        if self.on_truncated is not None:
            self.on_truncated()

    # -- commands ------------------------------------------------------------------------

    def submit(self, event: Event[R]) -> asyncio.Future[R]:
        """Append ``event`` to the partition it belongs to (module doc)."""
        if isinstance(event, DeclareQueue):
            return cast("asyncio.Future[R]", asyncio.ensure_future(self._declare(event)))
        if isinstance(event, RoutedEnqueue):
            return cast("asyncio.Future[R]", asyncio.ensure_future(self._routed(event)))
        if isinstance(event, _EVERYWHERE):
            return cast("asyncio.Future[R]", asyncio.ensure_future(self._everywhere(event)))
        if isinstance(event, (Reserve, AcceptThrough)) and event.service:
            # A term over on control (as applied here) is refused at once; the data
            # partition fences in its own order behind it (FenceTerm).
            try:
                self.state.services.check_token(event.service, event.token)
            except BatonError as exc:
                failed: asyncio.Future[R] = asyncio.get_running_loop().create_future()
                failed.set_exception(exc)
                return failed
        queue = getattr(event, "queue", None)
        if isinstance(queue, str) and not isinstance(event, _CONTROL_QUEUE_EVENTS):
            k = self._elsewhere(queue)
            if k:
                return self.submit_to(k, event)
            node = self.part(queue)
            if node is self:
                fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
                fut.set_exception(QueueNotFound(f"queue {queue!r} does not exist"))
                return fut
            return node.submit(event)
        return super().submit(event)

    async def _everywhere(self, event: Event[R]) -> R:
        """An event every partition's state applies in its own order (feature flags,
        policies): control decides and answers; then each data partition has it."""
        result = await super().submit(event)
        done = await asyncio.gather(
            *(n.submit(event) for n in self.data.values()), return_exceptions=True
        )
        for node, outcome in zip(self.data.values(), done):
            if isinstance(outcome, BaseException):
                log.info("partition %d did not take %s yet (%s): its leader takes it from"
                         " control later", node.partition, type(event).__name__, outcome)
        if isinstance(result, PolicyChanged):
            # Control has no queues: those with a policy are counted where they are.
            queues = sum(r.queues for r in done if isinstance(r, PolicyChanged))
            return cast(R, replace(result, queues=queues))
        return result

    async def _follow_control(self) -> None:
        """Each data partition this runtime leads takes control's feature flags and
        policies that it lacks — a partition without a view when they were set refused
        them. A difference is acted on only when two looks a second apart see the same
        one, so that what is on its way (or control's own catching up) is not undone."""
        seen: dict[int, list[Event[Any]]] = {}
        unrecorded = 0
        while True:
            await asyncio.sleep(FOLLOW_INTERVAL)
            # The log's count, when control has not recorded it (a new cluster, or a
            # growth whose broker died between growing the log and recording it):
            # recorded, so that placement and every broker go by it (design.md §16).
            now = self._unrecorded_count()
            if now and now == unrecorded:
                self.submit(GrowPartitions(now)).add_done_callback(ignore_outcome)
                log.info("node %s: recording the log's %d data partitions on control",
                         self.key, now)
                now = 0
            unrecorded = now
            try:
                await self.replication.tick()
            except Exception:  # a bug: said with its traceback, never a crash
                log.exception("node %s: replica groups' duties failed", self.key)
            for k, node in list(self.data.items()):  # (growth may add to it meanwhile)
                events = (
                    lacking(self.state, node.state)
                    if node.state.membership.leader() == self.key and self.joined.is_set()
                    else []
                )
                if not events or seen.get(k) != events:
                    seen[k] = events
                    continue
                seen.pop(k)
                for ev in events:
                    try:
                        await node.submit(ev)
                    except BatonError as exc:
                        log.warning("partition %d could not take control's %s: %s",
                                    k, type(ev).__name__, exc)
                        break
                else:
                    log.info("partition %d took control's %s", k,
                             ", ".join(type(ev).__name__ for ev in events))

    def _unrecorded_count(self) -> int:
        """The log's data partitions, if more than control recorded (0: none more, or
        this broker cannot record them now: not a member, or the flag is off)."""
        have = self.logs.count - 1
        if (
            have > self.state.placement.partitions
            and self.joined.is_set()
            and "partitions" in self.state.features.enabled
        ):
            return have
        return 0

    async def place(self, queue: str, partition: int) -> int:
        if not 0 <= partition <= self.count:
            raise InvalidArgument(
                f"partition {partition} does not exist: this cluster's data partitions are"
                f" 1 to {self.count}"
            )
        placed: Placed = await super().submit(PlaceQueues((queue,), partition, self.count))
        return placed.partition

    async def _declare(self, ev: DeclareQueue) -> Any:
        """Place the queue (with its dead-letter queue) on control unless it is placed,
        then declare it on its data partition. A new queue of a user (flag user_limits)
        is placed with the user, on control, which counts the user's queues there."""
        user = ev.user if "user_limits" in self.state.features.enabled else None
        if ev.user is not None:
            # The data partitions do not count (their user tables are empty): control does.
            ev = replace(ev, user=None)
        k = self.state.placement.get(ev.queue)
        dlq = self.state.placement.get(ev.dead_letter) if ev.dead_letter else None
        new = k is None or k not in self.data or ev.queue not in self.data[k].state.queues
        claim = user if new and self.state.placement.claims.get(ev.queue) != user else None
        if k is None or (ev.dead_letter is not None and dlq is None) or claim is not None:
            names = (ev.queue,) if ev.dead_letter is None else (ev.queue, ev.dead_letter)
            placed: Placed = await super().submit(PlaceQueues(names, 0, self.count, claim))
            k = placed.partition
        if k not in self.data and k not in self.wanted():
            try:  # (replica groups: a partition this broker does not apply)
                return await self._remote(k, ev)
            except BatonError:
                if claim is not None:
                    self._release(ev.queue)  # (a declare refused there does not count)
                raise
        node = self.data.get(k) or await self.growth.started(k)  # (a new partition)
        try:
            return await node.submit(ev)
        except BatonError:
            if claim is not None and ev.queue not in node.state.queues:
                # Not declared after all (bad settings): it does not count for the user.
                self._release(ev.queue)
            raise

    def _release(self, queue: str) -> None:
        """``queue`` is gone from its data partition: if it counts for a user on control,
        it does no more (every broker appends it; the first applied counts)."""
        user = self.state.placement.claims.get(queue)
        if user is not None:
            super().submit(ReleaseQueue(queue, user)).add_done_callback(ignore_outcome)

    async def _routed(self, ev: RoutedEnqueue) -> Routed:
        """A publish through an exchange: on one data partition as it is; over several,
        one FanOut on the first of them, which forwards it to the others
        (cluster/forwarding.py)."""
        by_part: dict[int, list[str]] = {}
        missing: list[str] = []
        for name in ev.queues:
            k = self._elsewhere(name)
            node = self.part(name) if not k else None
            if node is self:
                missing.append(name)
            else:
                by_part.setdefault(k or cast(Node, node).partition, []).append(name)
        if not by_part:
            return Routed([], [], [], missing)
        # The home: a partition applied here if there is one (no hop), else the first.
        home = min(by_part, key=lambda k: (k not in self.data, k))
        others = sorted(k for k in by_part if k != home)
        if not others:
            done = await self.submit_to(home, replace(ev, queues=tuple(by_part[home])))
        else:
            done = await self.submit_to(home, FanOut(
                tuple(by_part[home]), ev.messages, ev.keys, ev.exchange, ev.routing_key,
                ev.delay_ms, ev.not_before, ev.priority,
                tuple((k, tuple(by_part[k])) for k in others), ev.ttls,
            ))
        return Routed(done.queues, done.positions, done.full, done.missing + missing)

    def _data_effects(self, k: int) -> EffectListener:
        """Data partition ``k``'s effects, to the broker; then, if this runtime leads the
        partition, its dead letters are routed and its entries for other partitions
        forwarded."""

        def listen(effects: list[Effect]) -> None:
            if k in self.replication.closing:
                return  # (leaving it: its view without us is no fencing of this broker)
            if self._listener is not None:
                self._listener(effects)
            node = self.data.get(k)  # (None while a new partition's node starts)
            if node is None:
                return
            for e in effects:
                if isinstance(e, QueueGone) and e.queue not in node.state.queues:
                    self._release(e.queue)
            self._kick(k)

        return listen

    def _kick(self, k: int) -> None:
        """Start what partition ``k``'s leader has to route or forward (one task each)."""
        node = self.data[k]
        forwards = node.state.forwards
        if not (forwards.outbound or forwards.unrouted):
            return
        if node.state.membership.leader() != self.key:
            return
        if forwards.unrouted and (k, 0) not in self._forwarding:
            self._forwarding.add((k, 0))
            asyncio.ensure_future(self._route(k))
        for target in list(forwards.outbound):
            if (k, target) not in self._forwarding and 1 <= target <= self.count:
                self._forwarding.add((k, target))
                asyncio.ensure_future(self._forward(k, target))

    def routes(self, letter: DeadLetter) -> tuple[list[str], dict[int, list[str]]]:
        """Where a dead letter goes, by the placement map and the bindings as applied
        here on control (as a publish is routed at the edge): its queues, by data
        partition; names placed nowhere are left out."""
        if letter.exchange is None:
            names = [letter.dead_letter] if letter.dead_letter else []
        else:
            try:
                names = self.state.exchanges.route(
                    letter.exchange, letter.routing_key, {}, self.state.placement
                )
            except BatonError:
                names = []  # the exchange is gone: dead-lettered nowhere
        by_part: dict[int, list[str]] = {}
        for name in names:
            k = self.state.placement.get(name)
            if k is not None and name != letter.queue:
                by_part.setdefault(k, []).append(name)
        return names, by_part

    async def _route(self, home: int) -> None:
        """Route partition ``home``'s dead letters in its outbox, in number order: one
        RouteDeadLetter each on ``home`` (the first applied decides)."""
        src = self.data[home]
        try:
            while src.state.membership.leader() == self.key:
                unrouted = sorted(src.state.forwards.unrouted.items())
                if not unrouted:
                    return
                sent = []
                for n, letter in unrouted:
                    _, by_part = self.routes(letter)
                    local = tuple(by_part.pop(home, ()))
                    forward = tuple((k, tuple(qs)) for k, qs in sorted(by_part.items()))
                    sent.append(src.submit(RouteDeadLetter(n, local, forward)))
                results = await asyncio.gather(*sent, return_exceptions=True)
                failed = next((r for r in results if isinstance(r, BaseException)), None)
                if failed is not None:
                    log.warning("routing dead letters of partition %d waits: %s", home, failed)
                    await asyncio.sleep(0.5)
        except (BatonError, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning("routing dead letters of partition %d stopped: %s", home, exc)
        finally:
            self._forwarding.discard((home, 0))

    async def _forward(self, home: int, target: int) -> None:
        """Forward partition ``home``'s entries for ``target`` in number order: each
        appended there (a duplicate counts as done), then ForwardDone on ``home``."""
        src = self.data[home]
        try:
            while src.state.membership.leader() == self.key:
                entries = src.state.forwards.pending(target)
                if not entries:
                    return
                sent = []
                for n, e in entries:
                    messages = e.messages
                    if e.outbox >= 0:  # a dead letter: its body is in the outbox
                        body = src.store.get_messages(OUTBOX_QID, [e.outbox])[0]
                        if body is None:
                            break  # not stored here yet (or still on its way to a joiner)
                        messages = ((body.body, body.headers),)
                    sent.append(self.submit_to(target, ForwardIn(
                        home, n, e.queues, messages, e.keys, e.exchange, e.routing_key,
                        e.delay_ms, e.not_before, e.priority, e.ttls,
                    )))
                results = await asyncio.gather(*sent, return_exceptions=True)
                through = -1
                for (n, _), r in zip(entries, results):
                    if isinstance(r, BaseException):
                        break
                    through = n
                if through >= 0:
                    await src.submit(ForwardDone(target, through))
                failed = next((r for r in results if isinstance(r, BaseException)), None)
                if failed is not None or len(sent) < len(entries):
                    if failed is not None and not isinstance(failed, ForwardGap):
                        log.warning(
                            "forwarding from partition %d to %d waits: %s", home, target, failed
                        )
                    await asyncio.sleep(0.5)
        except (BatonError, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning("forwarding from partition %d to %d stopped: %s", home, target, exc)
        finally:
            self._forwarding.discard((home, target))

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, address: str = "", timeout: float = 60.0) -> None:
        """Start the control partition's node, then every data partition's, each
        catching up with (or joining) its own partition."""
        await super().start(address, timeout)
        # Replica groups: what control says this broker no longer applies is not started,
        # and its data goes (cluster/replication.py).
        wanted = self.wanted()
        for k in sorted(set(self.data) - wanted):
            del self.data[k]
            log.info("node %s: not in data partition %d's group: deleting its data here",
                     self.key, k)
            if self.replication.drop_store is not None:
                self.replication.drop_store(k)
        await asyncio.gather(*(n.start(address, timeout) for n in self.data.values()))
        self._tasks.append(asyncio.create_task(self._follow_control(), name="baton-follow"))
        self.growth.begin()  # partitions recorded on control (or its groups) not open here
        await self.replication.settle(timeout)
        log.info("node %s: applying %d of %d data partitions", self.key, len(self.data),
                 self.count)

    async def leave(self) -> None:
        await asyncio.gather(*(n.leave() for n in self.data.values()), super().leave())

    async def stop(self, why: str | None = None) -> None:
        await self.growth.stop()
        await asyncio.gather(*(n.stop(why) for n in self.data.values()))
        await super().stop(why)

