"""Producer and consumer worker processes of a load-test run.

Each worker is its own process (so the Python client is not the bottleneck of the
measurement) running one uvloop event loop, and writes its own history file (see
:mod:`batonmq.loadtest.history`). The runner talks to it only through a shared progress
counter and a stop event.

The workers speak to the system under test through a client adapter
(:mod:`batonmq.loadtest.adapters`): Baton, RabbitMQ or NATS JetStream, the same loop for each.
A third kind of worker, Baton only, runs candidates for a service's leadership
(``Workload.leaders``).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Protocol

from batonmq.loadtest.adapters import BatonAdapter, ClientAdapter, Delivery, Subscription
from batonmq.loadtest.connect import open_adapter
from batonmq.loadtest.history import (
    FLAG_NORMAL,
    FLAG_REJECT,
    FLAG_RELEASE,
    HistoryWriter,
    OpKind,
    make_body,
    parse_body,
)
from batonmq.cluster.errors import BatonError, Timeout
from batonmq.loadtest.workloads import Workload

__all__ = [
    "WorkerSpec", "worker_main", "consume_queue", "drain_queues", "Counter", "StopFlag",
    "DRAIN_ACTOR", "LEADER_SERVICE", "LEAD_HOLD",
]

#: The runner's final drain's actor in the history.
DRAIN_ACTOR = "drain"

#: How many confirmed ack batches one consumer keeps in flight.
_ACKS_IN_FLIGHT = 4

#: The service the ``leaders`` workload's candidates run for.
LEADER_SERVICE = "lt-leader"

#: Seconds a candidate keeps its term before it resigns (unless it loses it first).
LEAD_HOLD = 1.0


class Counter(Protocol):
    """A shared int (``multiprocessing.Value``): the worker's progress for the runner."""

    value: int


class StopFlag(Protocol):
    """A shared flag (``multiprocessing.Event``): the runner asks consumers to stop."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything one worker process needs (picklable).

    Attributes:
        role: ``"producer"``, ``"consumer"`` or ``"leader"`` (the service candidates of
            ``workload.leaders``; Baton only).
        actor: the worker's id in the history (``p1``, ``c2``).
        addresses: broker addresses (the worker's preferred broker first).
        queues: the queues it publishes to / consumes from.
        ack_all: queues on which every message is accepted (dead-letter queues).
        workload: the run's workload.
        history: path of its history file.
        duration: seconds to publish for.
        max_messages: this producer's share of the message cap (None: no cap).
        rate: this producer's share of the target rate (None: open loop).
        seed: seed of its random choices (poison flags).
        system: which client adapter (``baton``, ``rabbitmq``, ``nats``).
    """

    role: str
    actor: str
    addresses: tuple[str, ...]
    queues: tuple[str, ...]
    ack_all: tuple[str, ...]
    workload: Workload
    history: str
    duration: float
    max_messages: int | None
    rate: float | None
    seed: int
    system: str = "baton"


def _flag(rng: random.Random, workload: Workload) -> int:
    if workload.release_share or workload.reject_share:
        x = rng.random()
        if x < workload.release_share:
            return FLAG_RELEASE
        if x < workload.release_share + workload.reject_share:
            return FLAG_REJECT
    return FLAG_NORMAL


async def _produce(spec: WorkerSpec, counter: Counter) -> None:
    """Publish for the duration (or up to the cap) with ``window`` publishers in flight.

    The producer runs ``window`` publisher coroutines for its whole life, each with at
    most one publish awaiting its confirm: the window bounds what is unconfirmed, and no
    task, semaphore or callback is made per message (the generator must stay far from
    saturating its core, or it measures itself: docs/loadtest.md "The generator").
    """
    w = HistoryWriter(spec.history, spec.actor)
    rng = random.Random(spec.seed)
    workload = spec.workload
    conn = await open_adapter(spec.system, list(spec.addresses), workload)
    w.record(OpKind.CONNECTED, info=conn.address)
    errors = conn.errors
    record = w.record
    failovers = conn.failovers

    baton = conn if isinstance(conn, BatonAdapter) else None  # delays are Baton's
    delayed = baton is not None and workload.delay_share > 0 and workload.delay > 0
    delay_info = f"delay_ms={int(workload.delay * 1000)}"

    queues = spec.queues
    n = len(queues)
    cap = spec.max_messages
    start_ns = time.monotonic_ns()
    deadline_ns = start_ns + int(spec.duration * 1e9)
    rate = spec.rate
    interval_ns = int(1e9 / rate) if rate else 0
    seq = 0  # messages taken by the publishers so far
    monotonic_ns = time.monotonic_ns
    sleep = asyncio.sleep

    async def publisher() -> None:
        nonlocal seq, failovers
        while True:
            if monotonic_ns() >= deadline_ns or (cap is not None and seq >= cap):
                return
            due = 0
            if rate is not None:
                # Target rate: message k is due at start + k / rate. Its latency is also
                # measured from that intended time (coordinated omission: a stalled
                # system must not make the messages it delayed look fast). A publisher
                # takes the next message when its last one is confirmed and sleeps until
                # it is due; when all are busy, later messages go out late.
                due = start_ns + seq * interval_ns
                if due >= deadline_ns:
                    return
            seq += 1
            # Everything random is drawn here, before any await: in message order, so a
            # seed gives every message id the same flags whatever the scheduling.
            k = seq
            mid = f"{spec.actor}:{k}"
            queue = queues[k % n]
            body = make_body(mid.encode(), _flag(rng, workload), workload.size)
            later = delayed and rng.random() < workload.delay_share
            lag = -1
            if rate is not None:
                now_ns = monotonic_ns()
                if now_ns < due:
                    await sleep((due - now_ns) / 1e9)
                lag = monotonic_ns() - due
            # A delayed message says so in its invoke record: the checker's bound.
            record(OpKind.PUBLISH_INVOKE, queue, mid, count=lag, info=delay_info if later else "")
            try:
                if later and baton is not None:
                    position = await baton.publish_delayed(queue, body, workload.delay)
                else:
                    position = await conn.publish(queue, body)
            except errors as exc:
                record(OpKind.PUBLISH_FAIL, queue, mid, info=f"{type(exc).__name__}: {exc}")
            else:
                record(OpKind.PUBLISH_OK, queue, mid, position)
                counter.value += 1
            if conn.failovers != failovers:
                failovers = conn.failovers
                record(OpKind.CONNECTED, info=conn.address)

    try:
        await asyncio.gather(*(publisher() for _ in range(max(1, workload.window))))
    finally:
        try:
            await asyncio.wait_for(conn.close(), 10)
        except (TimeoutError, *conn.errors):  # type: ignore[misc]
            pass  # closing is best effort: the history below must be written
        finally:
            w.close()


async def consume_queue(
    conn: ClientAdapter,
    queue: str,
    actor: str,
    w: HistoryWriter,
    workload: Workload,
    *,
    ack_all: bool,
    counter: Counter | None = None,
    stop: StopFlag | None = None,
    idle_stop: float | None = None,
) -> None:
    """Consume ``queue`` on ``conn`` and record every step, until told to stop.

    Normal messages are accepted in batches (a few batches in flight; Baton confirms
    each batch); poison ones are released or rejected unless ``ack_all``.

    Args:
        conn: an open client adapter.
        queue: the queue.
        actor: this consumer's id in the history (``<worker>/<queue>``).
        w: the history writer.
        workload: prefetch, ack batch size.
        ack_all: accept every message (dead-letter queues, the final drain).
        counter: incremented per accepted message.
        stop: stop at the next idle moment once set.
        idle_stop: stop after this many seconds without a message.
    """
    record = w.record
    errors = conn.errors
    failovers = conn.failovers
    in_flight: set[asyncio.Task[None]] = set()
    worker = actor.split("/", 1)[0]

    async def ack(batch: list[tuple[Delivery, str]], sub: Subscription) -> None:
        try:
            outcomes = await sub.ack_many([d for d, _ in batch])
        except errors as exc:
            outcomes = [exc] * len(batch)
        now = time.monotonic_ns()
        ok = 0
        for (d, mid), err in zip(batch, outcomes):
            if err is None:
                record(OpKind.ACK_OK, queue, mid, d.position, t=now, actor=actor)
                ok += 1
            else:
                record(OpKind.ACK_FAIL, queue, mid, d.position, t=now, actor=actor,
                       info=f"{type(err).__name__}: {err}")
        if counter is not None:
            counter.value += ok

    idle_since = time.monotonic()
    sub: Subscription | None = None
    try:
        sub = await conn.subscribe(queue, workload.prefetch)
        while True:
            batch = await sub.get_many(workload.ack_batch, timeout=0.1)
            if conn.failovers != failovers:
                # The broker we consumed from is gone: it released our holds (§5.6).
                failovers = conn.failovers
                record(OpKind.CONSUMER_LOST, queue, actor=actor, info="failover")
                record(OpKind.CONNECTED, actor=worker, info=conn.address)
            if not batch:
                if stop is not None and stop.is_set():
                    break
                if idle_stop is not None and time.monotonic() - idle_since > idle_stop:
                    break
                continue
            idle_since = time.monotonic()
            now = time.monotonic_ns()
            acks: list[tuple[Delivery, str]] = []
            releases: list[Delivery] = []
            rejects: list[Delivery] = []
            for d in batch:
                mid, flag = parse_body(d.body)
                record(OpKind.DELIVER, queue, mid, d.position, d.delivery_count, t=now, actor=actor)
                if ack_all or flag == FLAG_NORMAL or not flag:
                    acks.append((d, mid))
                elif flag == FLAG_RELEASE:
                    record(OpKind.RELEASE, queue, mid, d.position, d.delivery_count, actor=actor)
                    releases.append(d)
                else:
                    record(OpKind.REJECT, queue, mid, d.position, d.delivery_count, actor=actor)
                    rejects.append(d)
            if releases:
                await sub.release_many(releases)
            if rejects:
                await sub.reject_many(rejects)
            if acks:
                for d, mid in acks:
                    record(OpKind.ACK_INVOKE, queue, mid, d.position, t=now, actor=actor)
                while len(in_flight) >= _ACKS_IN_FLIGHT:
                    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                task = asyncio.create_task(ack(acks, sub))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.gather(*in_flight)
        await sub.close()
    except errors as exc:
        if in_flight:
            await asyncio.gather(*in_flight, return_exceptions=True)
        record(OpKind.CONSUMER_LOST, queue, actor=actor, info=f"{type(exc).__name__}: {exc}")
        return
    # Cancelled: the broker released whatever this consumer still held.
    record(OpKind.CONSUMER_END, queue, actor=actor)


async def drain_queues(
    system: str, addresses: list[str], workload: Workload, w: HistoryWriter, idle: float,
    wait: float,
) -> None:
    """Accept everything left on every queue (dead-letter queues last) as actor
    ``drain``, and record each queue's final depth."""
    queues = list(workload.queue_names())
    # Work queues first: their poison messages may still move to the dead-letter queues.
    dlqs = [d for q in queues if (d := workload.dead_letter_of(q)) is not None]
    conn = await open_adapter(system, addresses, workload)
    w.record(OpKind.CONNECTED, info=conn.address)

    async def drain(queue: str) -> None:
        # Idle is not empty: messages a killed or cut-off broker's consumers held come
        # back only once the cluster has noticed (its failure detector), which may take
        # longer than the idle time. Come back while the queue still reports any.
        deadline = time.monotonic() + wait
        while True:
            await consume_queue(conn, queue, DRAIN_ACTOR, w, workload, ack_all=True,
                                idle_stop=idle)
            try:
                left, _ = await conn.depth(queue)
            except conn.errors:
                left = -1  # unknown: try again until the deadline
            if left == 0 or time.monotonic() >= deadline:
                return
            await asyncio.sleep(min(idle, max(0.0, deadline - time.monotonic())))

    try:
        for group in (queues, dlqs):
            await asyncio.gather(*(drain(q) for q in group))
        for q in queues + dlqs:
            left, stats = await conn.depth(q)
            w.record(OpKind.FINAL, q, count=left, info=json.dumps(stats, default=str))
    finally:
        await conn.close()


async def _consume(spec: WorkerSpec, counter: Counter, stop: StopFlag) -> None:
    w = HistoryWriter(spec.history, spec.actor)
    conn = await open_adapter(spec.system, list(spec.addresses), spec.workload)
    w.record(OpKind.CONNECTED, info=conn.address)
    try:
        await asyncio.gather(
            *(
                consume_queue(
                    conn,
                    q,
                    f"{spec.actor}/{q}",
                    w,
                    spec.workload,
                    ack_all=q in spec.ack_all,
                    counter=counter,
                    stop=stop,
                )
                for q in spec.queues
            )
        )
    finally:
        try:
            await asyncio.wait_for(conn.close(), 10)
        except (TimeoutError, *conn.errors):  # type: ignore[misc]
            pass  # closing is best effort: the history below must be written
        finally:
            w.close()


async def _lead(spec: WorkerSpec, counter: Counter) -> None:
    """Run ``workload.leaders`` candidates for :data:`LEADER_SERVICE` until the duration
    is over, each on its own connection (actor ``<worker>.<n>``, its first broker in
    turn): take the term, keep it :data:`LEAD_HOLD` s or until it is lost, resign, run
    again. A term is recorded (``lead``, with its fencing token) once the client knows
    it leads, and its end (``lead-end``) as soon as the candidate stops acting as the
    leader: before it resigns, or when the client learns it lost the term.
    """
    w = HistoryWriter(spec.history, spec.actor)
    record = w.record
    deadline = time.monotonic() + spec.duration
    addresses = list(spec.addresses)

    async def candidate(i: int) -> None:
        actor = f"{spec.actor}.{i + 1}"
        k = i % len(addresses)
        conn: BatonAdapter | None = None
        failovers = 0
        try:
            while time.monotonic() < deadline:
                if conn is None or conn.closed:
                    if conn is not None:
                        await conn.close()
                    try:
                        conn = await BatonAdapter.open(addresses[k:] + addresses[:k])
                    except BatonError:
                        conn = None
                        await asyncio.sleep(0.5)  # pacing: no broker answers right now
                        continue
                    failovers = conn.failovers
                    record(OpKind.CONNECTED, actor=actor, info=conn.address)
                try:
                    wait = max(0.1, deadline - time.monotonic())
                    async with conn.lead(LEADER_SERVICE, timeout=wait) as term:
                        if conn.failovers != failovers:  # granted to a new session
                            failovers = conn.failovers
                            record(OpKind.CONNECTED, actor=actor, info=conn.address)
                        record(OpKind.LEAD, LEADER_SERVICE, actor=actor, count=term.token,
                               info=term.candidate)
                        counter.value += 1
                        hold = min(LEAD_HOLD, deadline - time.monotonic())
                        why = "done" if hold <= 0 else "resigned"
                        if hold > 0:
                            try:
                                await asyncio.wait_for(term.lost.wait(), hold)
                                why = "lost"
                            except TimeoutError:
                                pass
                        # Before the block resigns: from here on it acts as leader no more.
                        record(OpKind.LEAD_END, LEADER_SERVICE, actor=actor, count=term.token,
                               info=why)
                except Timeout:
                    pass  # the duration ended while it waited for the term
                except BatonError as exc:
                    record(OpKind.LEAD_END, LEADER_SERVICE, actor=actor,
                           info=f"error {type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.1)  # pacing after a failed run for the term
                if conn is not None and conn.failovers != failovers:
                    failovers = conn.failovers
                    record(OpKind.CONNECTED, actor=actor, info=conn.address)
        finally:
            if conn is not None:
                try:
                    await asyncio.wait_for(conn.close(), 10)
                except (TimeoutError, BatonError):
                    pass  # closing is best effort: the history must still be written

    try:
        await asyncio.gather(*(candidate(i) for i in range(max(1, spec.workload.leaders))))
    finally:
        w.close()


async def _main(spec: WorkerSpec, counter: Counter, stop: StopFlag) -> None:
    # SIGTERM (the runner gave up waiting) cancels the work, so that the finally blocks
    # still close the connection and flush the history: a worker killed with its
    # records in the buffer would make the checker see confirmed messages as lost.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    if spec.role == "producer":
        await _produce(spec, counter)
    elif spec.role == "leader":
        await _lead(spec, counter)
    else:
        await _consume(spec, counter, stop)


def worker_main(spec: WorkerSpec, counter: Any, stop: Any) -> None:
    """Entry point of a worker process: run the producer or consumer loop to its end."""
    import uvloop

    try:
        uvloop.run(_main(spec, counter, stop))
    except KeyboardInterrupt:
        sys.exit(130)
    except asyncio.CancelledError:
        print(f"loadtest worker {spec.actor}: stopped by SIGTERM", file=sys.stderr)
        sys.exit(143)
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
