"""Growing N on one broker: opening the data partitions that control recorded
(docs/design.md §16, "Growing N"; docs/operations.md "Growing N").

An operator's ``baton partitions add --count M`` makes the log have M + 1 partitions
and then appends :class:`~batonmq.cluster.events.GrowPartitions` to the control
partition (broker/partitions.py). Every broker applies it in control's log order, and
its :class:`Growth` then opens each new partition on this broker: it learns of the
log's new partitions (growing the log itself if they are not there yet: idempotent,
and safe against other processes doing the same), opens the partition's store, starts
a data node for it, which catches up with (or joins) that partition as any data
partition's node does, and hands it to its :class:`~batonmq.cluster.partitioned.
Partitioned` once it is a member of the partition's view. Then it gives the new
partition what the others have from control: the policies, and each service's current
term (FenceTerm).

A broker that cannot open a new partition (the log refuses, its store cannot be
opened) says so once per reason (an ERROR line and :attr:`Growth.problem`, shown in
the topology), keeps serving the partitions it has, and tries again every few
seconds. A broker that restarts opens every partition the log has; a partition that
control recorded and the log lacks (every broker failed to make it) is opened by the
same task once the broker runs.

Not pure: it drives nodes, the log set and stores. Only one growth runs at a time per
broker; it never removes a partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from batonmq.cluster.appender import ignore_outcome
from batonmq.cluster.errors import BatonError, LogUnavailable, Timeout
from batonmq.cluster.events import ClearPolicy, EnableFeatures, Event, FenceTerm, SetPolicy
from batonmq.cluster.features import FEATURES
from batonmq.cluster.log import LogSet
from batonmq.cluster.node import Node
from batonmq.cluster.state import State
from batonmq.store import Store

__all__ = ["Growth", "Grown", "lacking"]


class Grown(Protocol):
    """What :class:`Growth` needs of the broker's control node
    (:class:`~batonmq.cluster.partitioned.Partitioned`)."""

    key: str
    address: str
    state: State
    data: dict[int, Node]
    logs: LogSet
    open_store: Callable[[int], Store] | None

    @property
    def count(self) -> int: ...

    @property
    def serving(self) -> bool: ...

    def new_data_node(self, k: int, store: Store) -> Node: ...

    def wanted(self) -> set[int]: ...


log = logging.getLogger("baton.node")


def lacking(control: State, data: State) -> list[Event[Any]]:
    """What a data partition's state lacks of the ``control`` state's feature flags and
    policies: the events that would make it equal (none: equal)."""
    events: list[Event[Any]] = []
    flags = sorted(
        n for n in control.features.enabled if n in FEATURES and n not in data.features.enabled
    )
    if flags:
        events.append(EnableFeatures(tuple(flags)))
    want = {p.name: p for p in control.policies.listed()}
    have = {p.name: p for p in data.policies.listed()}
    for name, p in want.items():
        if have.get(name) != p:
            events.append(SetPolicy(p.name, p.pattern, p.apply_to, p.definition, p.priority))
    events.extend(ClearPolicy(name) for name in sorted(have.keys() - want.keys()))
    return events


#: Seconds between attempts to open a partition that failed, at most.
RETRY_MAX = 10.0


class Growth:
    """Opens, on one broker, the data partitions control recorded and it lacks.

    Args:
        owner: the broker's control node.
    """

    def __init__(self, owner: Grown) -> None:
        self._owner = owner
        self._task: asyncio.Task[None] | None = None
        self._running = False  # begin() called: the owner has started
        self._starting: dict[int, Node] = {}  # nodes started and not yet members
        self._refused: set[int] = set()  # partitions whose node was refused: not retried
        self._waiters: dict[int, list[asyncio.Future[Node]]] = {}
        #: Why a recorded partition is not open here (None: every one is, or opening).
        self.problem: str | None = None
        self._said: set[str] = set()  # problems logged already

    @property
    def missing(self) -> list[int]:
        """Data partitions this broker should apply and does not yet: those control
        recorded (of its replica groups, cluster/replication.py)."""
        owner = self._owner
        return sorted(k for k in owner.wanted() if k not in owner.data)

    def begin(self) -> None:
        """The owner has started: open what control recorded and the log lacked, and
        from now on what each applied GrowPartitions adds."""
        self._running = True
        self.check()

    def check(self) -> None:
        """After an applied control batch: start opening partitions if one is missing."""
        if not self._running or (self._task is not None and not self._task.done()):
            return
        if self.missing:
            self._task = asyncio.create_task(self._open_missing(), name="baton-grow")

    async def started(self, k: int, timeout: float = 60.0) -> Node:
        """Data partition ``k``'s node once this broker applies it (a queue just placed
        on a new partition waits for it).

        Raises:
            LogUnavailable: it is not open here within ``timeout`` seconds (why:
                :attr:`problem`), or it is not a partition of the cluster.
        """
        owner = self._owner
        node = owner.data.get(k)
        if node is not None:
            return node
        if not 1 <= k <= owner.count:
            raise LogUnavailable(f"data partition {k} is not a partition of this cluster")
        waiter: asyncio.Future[Node] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(k, []).append(waiter)
        self.check()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            why = f": {self.problem}" if self.problem else ""
            raise LogUnavailable(
                f"data partition {k} is not open on this broker yet{why}"
            ) from None
        finally:
            waiters = self._waiters.get(k, [])
            if waiter in waiters:
                waiters.remove(waiter)

    async def stop(self) -> None:
        """Stop opening; stop the nodes still starting."""
        self._running = False
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        nodes, self._starting = list(self._starting.values()), {}
        await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)

    # -- the opening task ----------------------------------------------------------------

    async def _open_missing(self) -> None:
        delay = 0.5
        while self._running and (todo := [k for k in self.missing if k not in self._refused]):
            try:
                # Together: each waits for its own partition's join update and view.
                done = await asyncio.gather(*(self._open(k) for k in todo),
                                            return_exceptions=True)
                failed = [r for r in done if isinstance(r, BaseException)]
                if failed:
                    raise failed[0]
                delay = 0.5
            except _Refused as exc:
                self._refused.add(exc.partition)
                self._say(f"data partition {exc.partition} was refused here: {exc.why};"
                          " this broker keeps serving the others; restart it to open it")
            except BatonError as exc:
                missing = ", ".join(map(str, todo))
                self._say(f"cannot open data partition(s) {missing} here:"
                          f" {exc.message}; this broker keeps serving the others and tries"
                          " again")
                await asyncio.sleep(delay)
                delay = min(RETRY_MAX, delay * 2)
            except Exception as exc:  # a bug: said with its traceback, never a crash
                log.exception("node %s: opening data partitions failed", self._owner.key)
                self.problem = f"opening data partitions failed: {exc!r}"
                await asyncio.sleep(RETRY_MAX)
        if not self.missing and self.problem is not None:
            log.info("node %s: every data partition is open here again", self._owner.key)
            self.problem = None
            self._said.clear()

    async def _open(self, k: int) -> None:
        """Open data partition ``k`` here: its log, its store, a node that joins it.

        Raises:
            BatonError: the log or the store cannot be opened, or the node was refused.
        """
        owner = self._owner
        node = self._starting.get(k)
        if node is None:
            if owner.logs.count <= k:
                await owner.logs.refresh()
            if owner.logs.count <= k:
                # Not there yet (the operator's broker made them: maybe not visible yet,
                # or it failed): make them; idempotent, and safe across brokers.
                await owner.logs.grow(owner.count + 1)
            if owner.open_store is None:
                raise LogUnavailable("this broker cannot open data partition stores")
            node = owner.new_data_node(k, owner.open_store(k))
            node.serving = owner.serving
            self._starting[k] = node
            log.info("node %s: opening data partition %d", owner.key, k)
            try:
                await node.start(owner.address)
            except Timeout:
                pass  # its tasks run on: wait for its membership below
            except BatonError as exc:
                # Refused (its store does not fit the log, say): not retried with the
                # same runtime id, which would reuse its origin sequence numbers.
                del self._starting[k]
                await node.stop()
                raise _Refused(k, exc.message) from exc
        if not node.joined.is_set():
            log.warning("node %s: data partition %d: not a member of its view yet; waiting",
                        owner.key, k)
            await node.joined.wait()
        del self._starting[k]
        node.serving = owner.serving
        owner.data[k] = node
        log.info("node %s: data partition %d is open here (%d of %d)", owner.key, k,
                 len(owner.data), owner.count)
        self._copy_control(node)
        for waiter in self._waiters.pop(k, []):
            if not waiter.done():
                waiter.set_result(node)

    def _copy_control(self, node: Node) -> None:
        """What every data partition has from control and a new one lacks: the feature
        flags and policies (:func:`lacking`, which the partition's leader also keeps
        following) and each service's current term. Idempotent (a flag enabled, a
        SetPolicy equal to the partition's, a FenceTerm not above its token, changes
        nothing), so every broker that opens the partition may send them; only what the
        partition lacks is sent."""
        state = self._owner.state
        for event in lacking(state, node.state):
            node.submit(event).add_done_callback(ignore_outcome)
        for name, s in sorted(state.services.services.items()):
            if s.leader is not None and node.state.range_tokens.get(name, -1) < s.token:
                node.submit(FenceTerm(name, s.token)).add_done_callback(ignore_outcome)

    def _say(self, problem: str) -> None:
        self.problem = problem
        if problem not in self._said:
            self._said.add(problem)
            log.error("node %s: %s", self._owner.key, problem)


class _Refused(Exception):
    """A data partition's node was refused at its start (not retried in this process)."""

    def __init__(self, partition: int, why: str) -> None:
        super().__init__(why)
        self.partition = partition
        self.why = why
