"""The replica driver: the I/O edge around the pure :class:`batonmq.cluster.state.State`.

A :class:`Node` is one broker's replica of the cluster state. It composes:

* the **appender** (``cluster/appender.py``) — :meth:`Node.submit` stamps an event
  with this process's origin and queues it; one task appends whatever has queued up
  as one log batch (group commit), retries while the log is unavailable, keeps
  publishes in the store meanwhile, and resolves each event's future once it is
  *both* durable on the log and applied here: the moment a command takes effect
  (docs/design.md §5);
* the **applier** (``cluster/applier.py``) — one task tails the log from the applied
  offset, applies each record to the state, writes the batch's effects and snapshots
  to the store with the batch's last offset, then dispatches the effects
  (completions, checkpoints, the listener: the broker);
* **checkpoints** (``cluster/checkpoints.py``) — the leader's periodic checkpoint,
  every replica's digest check, and log truncation;

and does the rest itself: starting from the store (or joining a live cluster with an
update, ``cluster/update.py``, for which it is the :class:`~batonmq.cluster.update.Joiner`
and the :class:`~batonmq.cluster.update.Donor`), heartbeats, and after each applied
batch its membership duties: tracking whether it is in the view, and proposing and
voting as :func:`batonmq.cluster.membership.duties` says.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from batonmq.cluster.appender import Appender, R, ignore_outcome
from batonmq.cluster.applier import Applier, EffectListener
from batonmq.cluster.checkpoints import Checkpoints
from batonmq.cluster.errors import (
    BatonError,
    JoinFailed,
    LogTruncated,
    InvalidArgument,
    Timeout,
    StoreError,
)
from batonmq.cluster.effects import Effect
from batonmq.cluster.events import EnableFeatures, Event, Heartbeat, Join, Leave, Propose, Vote
from batonmq.cluster.features import ANNOUNCE, FEATURES, MAX_FORMAT, VERSION
from batonmq.cluster.health import Health
from batonmq.cluster.log import Log
from batonmq.cluster.member_proof import MemberKey
from batonmq.cluster.membership import OBSERVER, Ballot, duties
from batonmq.cluster.queues import QueueState
from batonmq.cluster.snapshot import FormatUnsupported
from batonmq.cluster.state import State
from batonmq.cluster.update import Catchup, Progress, find_donors
from batonmq.store import Batch, Loaded, Store

__all__ = ["Node", "steady_clock"]

log = logging.getLogger("baton.node")


def steady_clock() -> Callable[[], int]:
    """Wall-clock milliseconds that a step of the wall clock does not move: the wall
    time read now plus the monotonic time elapsed since.

    Envelope times feed the replicated clock (the largest one applied, docs/design.md
    §4) and TTL; an NTP step or an operator's ``date -s`` on one broker would otherwise
    push the whole cluster's clock minutes ahead (expiring messages early) or stamp
    events in the past. A wrong wall clock at start still counts (docs/operations.md
    "Clocks").
    """
    wall0 = time.time()
    mono0 = time.monotonic()
    return lambda: int((wall0 + (time.monotonic() - mono0)) * 1000)


_LOG = log  # (Node's methods have a parameter named log)


class _Partition(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes a data partition node's log lines with its partition."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = self.extra or {}
        return f"partition {extra['partition']}: {msg}", kwargs


class Node:
    """One broker's replica of the cluster state.

    Args:
        node_id: this broker's persistent id.
        log: the ordered log (shared by every replica).
        store: this broker's local store.
        clock: wall-clock milliseconds (injectable for tests; default
            :func:`steady_clock`).
        max_append: most events per log append.
        max_outbox: most events waiting for the log (while it is unavailable);
            beyond it commands fail with LogUnavailable at once.
        append_linger_us: microseconds the appender waits before taking each batch
            (0: none): fewer, larger appends for that much more latency.
        role: "voter" or "observer" (docs/design.md §7).
        properties: instance properties published with heartbeats (e.g. a zone).
        heartbeat_ms: interval between heartbeats; suspicion comes after
            ``suspect_beats`` of another member's beats (observers: 3x).
        checkpoint_ms: how often the leader appends a checkpoint (digest check,
            log truncation); 0: never.
        join: how a broker with an empty store starts on a non-empty log:
            "auto" (an update from a live member, docs/design.md §8; replay the log from
            offset 0 if no member is alive and the log was never truncated),
            "update" (only an update), or "replay" (always replay the log).
        tls: the TLS context a join update's connection to a member is opened with
            (it verifies the member's certificate; docs/security.md), None: plaintext.
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
        append_linger_us: int = 0,
        role: str = "voter",
        properties: dict[str, Any] | None = None,
        heartbeat_ms: int = 500,
        suspect_beats: int = 6,
        checkpoint_ms: int = 5000,
        join: str = "auto",
        tls: ssl.SSLContext | None = None,
        runtime_id: str | None = None,
        partition: int = 0,
    ) -> None:
        if join not in ("auto", "update", "replay"):
            raise InvalidArgument("join must be 'auto', 'update' or 'replay'")
        self.node_id = node_id
        # One runtime id for every partition a broker process applies (cluster/partitioned.py).
        self.runtime_id = runtime_id or uuid.uuid4().hex[:12]
        self.key = f"{node_id}/{self.runtime_id}"  # this runtime's member key
        #: The physical log partition this node applies (0: the control partition, or
        #: the only one; docs/design.md §16).
        self.partition = partition
        #: This node's logger: a data partition's lines say which partition they are of.
        self.say: logging.Logger | logging.LoggerAdapter[logging.Logger] = (
            _LOG if partition == 0 else _Partition(_LOG, {"partition": partition})
        )
        # The key pair this runtime proves itself with when it joins live: the public
        # key goes on the log in its Join (cluster/member_proof.py).
        self.join_key = MemberKey()
        # How this broker connects to another for a join update (None: plaintext).
        self.tls = tls
        self.role = role
        self.properties = dict(properties or {})
        # The feature flags this build supports, announced in every heartbeat
        # (cluster/features.py): a flag is enabled only once every live runtime has them.
        self.properties[ANNOUNCE] = sorted(FEATURES)
        self.address = ""
        # Set by the broker once its client port answers (docs/design.md §8: only such a
        # runtime may be asked for a join update; Heartbeat.serving).
        self.serving = False
        # Set once this runtime has asked to leave the view (a clean stop): the view
        # that drops it then is its own doing, not a fencing.
        self.leaving = False
        # Whether some voter is alive, as applied here: without one no view can change
        # and an observer is on its own (shown in the topology, logged when it flips).
        self.voter_alive = True
        self.heartbeat_ms = heartbeat_ms
        self.joined = asyncio.Event()  # set while this runtime is in the established view
        self.refused: str | None = None
        self._proposed: Ballot | None = None
        self._voted: Ballot | None = None
        self.log = log
        self.store = store
        self.state = State(suspect_beats)
        self.health = Health()
        #: The envelope times' source, also the TTL check's "now" (broker/delivery.py).
        self.clock: Callable[[], int] = clock or steady_clock()
        self.appender = Appender(
            node_id, self.runtime_id, log, store, self.health,
            clock=self.clock,
            max_append=max_append,
            max_outbox=max_outbox,
        )
        self.appender.applied_offset = lambda: self.state.applied
        self.appender.linger_us = append_linger_us
        self.checkpoints = Checkpoints(
            self.key, self.state, log, self.health, self.joined, self.submit, checkpoint_ms
        )
        self.applier = Applier(
            node_id, self.runtime_id, self.state, log, store, self.health,
            completed=self.appender.applied,
            checkpointed=self.checkpoints.checked,
            after_batch=self._membership_duties,
            truncated=self._truncated,
            joining=self._joining,
            halted=self.appender.halt,
        )
        self.applied_event = self.applier.applied_event  # set after every applied batch
        # Held while a log batch is applied and stored: state == store outside it.
        self.apply_lock = self.applier.lock
        self._tasks: list[asyncio.Task[None]] = []
        self.holds: set[int] = set()  # capture offsets of updates this broker serves
        self.join_mode = join
        self.catchup: Catchup | None = None  # while this broker takes in an update
        self.join_report: dict[str, Any] | None = None
        self.on_unlocked: Callable[[str], None] | None = None
        self.on_truncated: Callable[[], None] | None = None  # the broker restarts us
        self._fresh_enabled = False  # this leader asked a new cluster to enable its flags
        self._refusals_said: set[str] = set()  # refused runtimes the leader logged
        self._stored_format = 1  # the format the store's "format" identity value says

    # -- what the parts keep, under the names the broker reads ---------------------

    @property
    def healthy(self) -> bool:
        """False from a failed append, log read or store write until the next batch is
        applied and stored."""
        return self.health.ok

    @healthy.setter
    def healthy(self, ok: bool) -> None:
        self.health.ok = ok

    @property
    def listener(self) -> EffectListener | None:
        """Called with each applied batch's effects, after the store has them."""
        return self.applier.listener

    @listener.setter
    def listener(self, listener: EffectListener | None) -> None:
        self.applier.listener = listener

    @property
    def checkpoint_ms(self) -> int:
        """How often the leader checkpoints (0: never)."""
        return self.checkpoints.interval_ms

    @property
    def last_checkpoint(self) -> dict[str, Any] | None:
        """The last checkpoint applied here: offset, digest, and the offset verified."""
        return self.checkpoints.last

    @property
    def digest_mismatches(self) -> int:
        """Checkpoints at which this replica's digest differed from the leader's."""
        return self.checkpoints.digest_mismatches

    @property
    def truncated_before(self) -> int:
        """The log's start offset after this broker's last truncation."""
        return self.checkpoints.truncated_before

    def submit(self, event: Event[R]) -> asyncio.Future[R]:
        """Append ``event``; the future resolves with its result once durable and applied.

        The future fails with the event's BatonError (e.g. QueueNotFound) if
        applying it failed; while the log cannot be written the event waits in the
        outbox and its append is retried (a publish is also kept in the store, so a
        broker that dies meanwhile appends it at its next start). It fails with
        LogUnavailable only when the outbox is full, ShuttingDown once the node stops.
        """
        return self.appender.submit(event)

    # -- partitions (docs/design.md §16; a node of one log has one, itself) -------------

    @property
    def queues(self) -> Mapping[str, QueueState]:
        """Every queue this broker applies, by name (of every data partition)."""
        return self.state.queues

    def part(self, queue: str) -> "Node":
        """The node that applies ``queue`` (its data partition's)."""
        return self

    def parts(self) -> list["Node"]:
        """Every node of this broker: the control partition's first."""
        return [self]

    def partition_node(self, partition: int) -> "Node | None":
        """The node of physical log partition ``partition``, if this broker applies it."""
        return self if partition == self.partition else None

    async def place(self, queue: str, partition: int) -> int:
        """Place ``queue`` on data ``partition`` (0: where the cluster chooses) before
        it is declared; returns its partition.

        Raises:
            InvalidArgument: no such partition.
        """
        if partition not in (0, 1):
            raise InvalidArgument(
                f"partition {partition} does not exist: this cluster has one data partition"
            )
        return 1

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
        self.appender.load_leftover()
        end = await self.log.end_offset()
        first = await self.log.start_offset()
        have = loaded.meta is not None or loaded.applied >= 0
        self._stored_format = self._check_store_format(loaded)
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
        elif have and self._stored_format > 1 and (loaded.meta is None or len(loaded.meta) <= 10):
            # A build from before feature flags ran on this data dir after a flag was
            # enabled: it skipped the records it could not read, so its state is not
            # the cluster's (docs/operations.md "Upgrading").
            why = (
                f"its store was last written by a build that cannot read format"
                f" {self._stored_format} (a downgrade after a feature flag was enabled)"
            )
        elif have and loaded.applied + 1 < first:
            why = f"the log was truncated past its applied offset {loaded.applied} (it starts at {first})"
        if why is not None:
            # docs/design.md §8: a broker whose offset is gone joins like a new one.
            self.say.warning("node %s starts again as a new broker: %s", self.node_id, why)
            self.store.reset()
            self.store.put_ident("update", "")  # set again if an update is installed
            self.store.put_ident("format", "")  # said again once a flag is applied
            self._stored_format = 1
            loaded, have = Loaded(), False
        if loaded.meta is not None:
            self.state.restore_meta(loaded.meta)  # FormatUnsupported: a downgrade
            self.state.restore_keys(loaded.keys)
            self.applier.keys_forgotten = loaded.keys[0][0] if loaded.keys else 0
        # Apart from the meta snapshot (None: a store from before exchanges: the built-ins).
        self.state.exchanges.restore(loaded.exchanges)
        for name, snap in loaded.queues.items():
            self.state.queues[name] = QueueState.restore(snap)
        self.state.apply_policies()  # the effective settings (cluster/policies.py)
        self.state.applied = loaded.applied
        self.appender.format = self.state.features.format
        if not have and end > first and self.join_mode != "replay":
            await self._join(first, timeout)
        elif not have and first > 0:
            raise LogTruncated(
                f"the log starts at offset {first}: a broker with an empty store cannot replay"
                " it; start it with join 'auto' or 'update' while a member is alive"
            )
        self.say.info(
            "node %s runtime %s: %d queues, resuming after log offset %d",
            self.node_id,
            self.runtime_id,
            len(self.state.queues),
            self.state.applied,
        )
        self._tasks = [
            asyncio.create_task(self.appender.run(), name="baton-append"),
            asyncio.create_task(self.applier.run(), name="baton-apply"),
            asyncio.create_task(self._heartbeat_loop(), name="baton-heartbeat"),
            asyncio.create_task(self.checkpoints.run(), name="baton-checkpoint"),
        ]
        if self.catchup is not None:
            self._tasks.append(asyncio.create_task(self.catchup.run(), name="baton-join"))
        await self._admitted(timeout)
        if self.refused is not None:
            raise InvalidArgument(self.refused)
        if self.applier.unreadable is not None:
            raise InvalidArgument(self.health.problem)
        self.appender.resubmit_leftover()
        self.say.info(
            "node %s joined view %d of cluster %s as %s",
            self.key,
            self.state.membership.view_seq,
            self.state.membership.cluster_id,
            self.role,
        )

    async def _admitted(self, timeout: float) -> None:
        """Wait until this runtime is in the established view.

        An observer never forms a view (docs/design.md §7): while no voter is alive on
        the log it waits for one, as long as it takes, and says so; the timeout counts
        from when a voter is there.

        Raises:
            Timeout: not a member within ``timeout`` seconds (of a voter being alive).
        """
        deadline = time.monotonic() + timeout
        alone_since: float | None = None
        said = False
        while not self.joined.is_set() and self.applier.unreadable is None:
            now = time.monotonic()
            if self.role == OBSERVER and not self.state.membership.voter_alive():
                if alone_since is None:
                    alone_since = now
                # Said once it lasts past a replay's first moments, when no voter may
                # have been applied yet.
                if not said and now - alone_since >= 2 * self.heartbeat_ms / 1000:
                    self.say.warning(
                        "observer %s: no voter is alive on the log; waiting for a voter to"
                        " form the cluster (an observer never forms or joins one alone)",
                        self.key,
                    )
                    said = True
                deadline = now + timeout
            else:
                alone_since = None
            if now > deadline:
                raise Timeout(f"not admitted to the cluster's view within {timeout:.0f}s")
            try:
                await asyncio.wait_for(self.joined.wait(), min(0.5, deadline - now + 0.01))
            except TimeoutError:
                pass
        if said:
            self.say.info("observer %s: a voter formed the cluster", self.key)

    # -- joining live (docs/design.md §8, cluster/update.py) -----------------------------------

    async def _join(self, first: int, timeout: float) -> None:
        """Get the state from a live member instead of replaying the log.

        Raises:
            Timeout: no member gave an update within ``timeout`` seconds.
            LogUnavailable: the Join cannot be appended.
        """
        record = self.appender.stamp(Join(self.address, self.join_key.public))
        at = await self.log.append([record])
        self.say.info("node %s: joining at log offset %d; looking for a live member", self.key, at)
        deadline = time.monotonic() + timeout
        wait = max(2.0, 4 * self.heartbeat_ms / 1000)
        while True:
            donors = await find_donors(self.log, at, self.node_id, wait, self.runtime_id)
            if not donors and self.join_mode == "auto" and first == 0:
                self.say.info("no live member: replaying the log from offset 0")
                return
            if donors:
                catchup = Catchup(self)
                catchup.on_unlocked = self._unlocked
                self.catchup = catchup
                try:
                    await catchup.begin(donors, at)
                    return
                except FormatUnsupported:
                    raise  # a newer build's cluster: no other member helps
                except BatonError as exc:
                    self.catchup = None
                    self.say.warning("join: %s", exc)
            if time.monotonic() > deadline:
                raise Timeout(
                    f"no live member gave this broker the cluster's state within {timeout:.0f}s"
                    " (the log was truncated, so it cannot be replayed)"
                    if first > 0 else
                    f"no live member gave this broker the cluster's state within {timeout:.0f}s"
                )
            await asyncio.sleep(0.5)

    async def rejoin(self) -> None:
        """Append this runtime's Join again, with the same key: the view dropped it
        before its update was done, which forgot the key (cluster/update.py)."""
        await self.submit(Join(self.address, self.join_key.public))

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
        self.applier.keys_forgotten = self.state.keys_floor()
        async with self.apply_lock:
            await self.applier.persist([], applied)

    def locked(self, queue: str) -> bool:
        """Is ``queue`` still being updated here (no interest, no delivery)?"""
        c = self.catchup
        return c is not None and c.locked(queue)

    def _unlocked(self, queue: str) -> None:
        self.say.debug("join: queue %s is up to date here", queue)
        if self.on_unlocked is not None:
            try:
                self.on_unlocked(queue)
            except Exception:
                self.say.exception("unlock listener failed")

    def commit_update(self, batch: Batch) -> None:
        """Write update messages (caller holds the apply lock: state == store)."""
        self.store.commit(batch, self.state.applied)

    def set_join_progress(self, text: str) -> None:
        """Shown to operators in the topology (heartbeat properties) and the log."""
        self.properties["join"] = text

    def update_finished(self, progress: Progress) -> None:
        """The update is taken in: every queue is served here now."""
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
            self.say.warning("cannot clear the update mark: %s", exc)
        self.properties.pop("join", None)
        self.catchup = None
        self.say.info(
            "join: done, %d queues and %d messages in %.1fs; every queue is served here",
            progress.queues, total, took,
        )
        for name in sorted(self.state.queues):
            self._unlocked(name)

    def hold(self) -> int:
        """The lowest log offset this broker still needs (Heartbeat.hold)."""
        return min([self.state.applied, *self.holds])

    # -- leaving, heartbeats and membership duties (docs/design.md §7) ---------------------------

    async def leave(self) -> None:
        """Tell the cluster this runtime leaves (clean shutdown): no suspicion wait."""
        if self.joined.is_set() and not self.appender.closing:
            self.leaving = True
            try:
                await asyncio.wait_for(self.submit(Leave()), 2)
            except (BatonError, TimeoutError):
                pass

    async def _heartbeat_loop(self) -> None:
        beat: asyncio.Future[None] | None = None
        while True:
            if beat is None or beat.done():  # no pile of beats while the log is down
                beat = self.submit(
                    Heartbeat(
                        self.role, self.address, dict(self.properties), self.hold(),
                        self.serving and self.catchup is None,
                    )
                )
                beat.add_done_callback(ignore_outcome)
            await asyncio.sleep(self.heartbeat_ms / 1000)

    def _check_store_format(self, loaded: Loaded) -> int:
        """The format the store says it holds (1: none said, an older build's store).

        Raises:
            FormatUnsupported: a newer build's store (a downgrade).
        """
        raw = self.store.get_ident("format")
        fmt = int(raw) if raw and raw.isdigit() else 1
        if fmt > MAX_FORMAT:
            raise FormatUnsupported(
                f"this data dir holds state of format {fmt}, which this build (Baton"
                f" {VERSION}, formats up to {MAX_FORMAT}) cannot read: a newer build wrote"
                " it, and a downgrade after a feature flag was enabled is not possible;"
                " run the newer build"
            )
        return fmt

    def _formats(self) -> None:
        """After each applied batch: write records in the cluster's format, and say in the
        store which format its state is in once a flag raised it."""
        fmt = self.state.features.format
        if fmt != self.appender.format:
            self.appender.format = fmt
            self.say.info("records are written in format %d from now on", fmt)
        if fmt > self._stored_format:
            try:
                self.store.put_ident("format", str(fmt))
                self._stored_format = fmt
            except StoreError as exc:  # said again after the next batch
                self.say.warning("cannot record the store's format: %s", exc)

    def _say_refusals(self) -> None:
        """The leader says once, at WARNING, each runtime the state refused from the view
        (a duplicate node id, a build lacking an enabled feature flag): that broker may
        be of a build that cannot say it itself."""
        ms = self.state.membership
        for key, why in ms.refused.items():
            if key in self._refusals_said:
                continue
            self._refusals_said.add(key)
            if ms.leader() == self.key and key != self.key:
                m = ms.known.get(key)
                self.say.warning(
                    "runtime %s%s is refused from the cluster's view: %s", key,
                    f" ({m.address})" if m is not None and m.address else "", why,
                )

    def _enable_fresh(self) -> None:
        """A cluster this leader has just made enables every flag its build knows (its
        first view; only this build's runtimes can be in it, or the enable is refused)."""
        self._fresh_enabled = True
        self.submit(EnableFeatures(tuple(FEATURES))).add_done_callback(ignore_outcome)

    def _membership_duties(self) -> None:
        """After each applied batch: track our own membership, and propose and vote as
        the policy says (cluster/membership.py)."""
        self._formats()
        ms = self.state.membership
        me = self.key
        if len(ms.refused) > len(self._refusals_said & ms.refused.keys()):
            self._say_refusals()
        if (
            not self._fresh_enabled and ms.view_seq == 1 and not self.state.features.enabled
            and ms.leader() == me and self.state.flagless_runtime() is None
        ):
            self._enable_fresh()
        if me in ms.refused:
            self.refused = ms.refused[me]
            self.joined.set()  # wakes start(), which raises
            return
        if ms.is_member(me):
            self.joined.set()
        else:
            self.joined.clear()
        # (A runtime that left or is suspected itself is going away: nothing to report.)
        alive = ms.voter_alive() or ms.suspected(me)
        if alive != self.voter_alive:
            self.voter_alive = alive
            if self.joined.is_set() and not alive:
                self.say.critical(
                    "no live voter: every voter of view %d is suspected; this %s keeps its"
                    " state and serves, but no view can change and no leader acts until a"
                    " voter is back (start one)", ms.view_seq, self.role,
                )
            elif self.joined.is_set():
                self.say.warning("a voter is alive again: the view can change")
        d = duties(ms, me, self.role, self._proposed, self._voted)
        if d.propose is not None:
            ballot = self._proposed = d.propose
            cluster_id = ms.cluster_id or uuid.uuid4().hex[:16]
            self.submit(Propose(ballot[0], ballot[1], cluster_id)).add_done_callback(
                lambda f: self._proposal_done(f, ballot)
            )
        if d.vote is not None:
            voted = self._voted = d.vote
            self.submit(Vote(voted[0], True)).add_done_callback(
                lambda f: self._vote_done(f, voted)
            )

    # A Propose or Vote was applied, or its append failed: it is no longer in flight,
    # so the duties make it again if it was ignored, lost or undone since. (Remembered
    # for good, a Propose whose append failed during a partition kept its view from
    # ever being proposed again, and a vote that counted for a proposal later replaced
    # by an equal one was never given again: the view never formed.)

    def _proposal_done(self, fut: asyncio.Future[Any], ballot: Ballot) -> None:
        ignore_outcome(fut)
        if self._proposed == ballot:
            self._proposed = None

    def _vote_done(self, fut: asyncio.Future[Any], ballot: Ballot) -> None:
        ignore_outcome(fut)
        if self._voted == ballot:
            self._voted = None

    async def stop(self, why: str | None = None) -> None:
        """Finish pending appends, stop the tasks. Pending commands fail with ShuttingDown
        (saying ``why``, if given: default, the broker shuts down)."""
        await self.appender.close(why=why)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self.appender.fail_waiting()

    # -- the applier's hooks ------------------------------------------------------------

    def _joining(self) -> Catchup | None:
        return self.catchup

    def _truncated(self) -> None:
        if self.on_truncated is not None:
            self.on_truncated()

