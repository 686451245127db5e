"""Workload presets: what the producers and consumers of a run do.

A :class:`Workload` is plain data (frozen, picklable: it is handed to worker processes).
``python -m batonmq.loadtest --preset NAME`` picks one of :data:`PRESETS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

__all__ = ["Workload", "PRESETS", "get_preset", "spread", "rotate"]


@dataclass(frozen=True, slots=True)
class Workload:
    """What a run does.

    Attributes:
        name: the preset's name.
        queues: how many queues (``lt-0`` .. ``lt-{n-1}``); producers spread messages
            over them round-robin, and every queue has at least one consumer.
        size: body bytes (the id and flag lead the body; see history.make_body).
        producers: producer worker processes.
        consumers: consumer worker processes (each subscribes to its share of queues).
        window: most unconfirmed publishes per producer process (bounds memory and, for
            open-loop runs, is the load).
        rate: target publish rate per second for the whole run (None: as fast as the
            window allows).
        max_messages: stop publishing after this many in all (None: only the duration).
        prefetch: consumer prefetch.
        ack_batch: most messages accepted with one confirmed ``ack_many``.
        release_share: share of messages (0..1) that consumers always release: they must
            be dead-lettered at the queue's delivery limit (§5.5).
        reject_share: share of messages (0..1) rejected at once (dead-lettered).
        delivery_limit: the queues' delivery limit.
        dead_letter: give every queue a dead-letter queue ``<queue>.dlq`` (drained too).
        backlog: start the consumers only when the producers are done, so they drain
            a backlog (the consume rate is then the drain rate).
        delay_share: share of messages (0..1) published with a ``delay`` (Baton only):
            the checker proves none is delivered before its time.
        delay: seconds those messages are held from consumers.
        retry_delay: the work queues' retry policy (Baton only, fixed, seconds; 0: none):
            the poison messages' failed releases come back no sooner, which the
            checker proves.
        leaders: candidates for the service ``lt-leader`` (Baton only; 0: none), each on
            a connection of its own, in one more worker process (``l1``): each takes
            the term in turn, keeps it a second (or until it is lost), resigns and runs
            again, for the duration; the checker proves one leader at a time and
            growing fencing tokens.
    """

    name: str
    queues: int = 1
    size: int = 1024
    producers: int = 2
    consumers: int = 2
    window: int = 500
    rate: float | None = None
    max_messages: int | None = None
    prefetch: int = 1000
    ack_batch: int = 250
    release_share: float = 0.0
    reject_share: float = 0.0
    delivery_limit: int = 20
    dead_letter: bool = False
    backlog: bool = False
    delay_share: float = 0.0
    delay: float = 0.0
    retry_delay: float = 0.0
    leaders: int = 0

    @property
    def work_queue(self) -> bool:
        """Does it use delays or retries (Baton's work-queue features)?"""
        return bool(self.delay_share and self.delay) or self.retry_delay > 0

    def queue_names(self) -> list[str]:
        """The work queues (not their dead-letter queues)."""
        return [f"lt-{i}" for i in range(self.queues)]

    def dead_letter_of(self, queue: str) -> str | None:
        """The dead-letter queue of ``queue`` (None if the workload has none)."""
        return f"{queue}.dlq" if self.dead_letter else None


PRESETS: dict[str, Workload] = {
    # Open loop at the broker's capacity: 1 KiB, confirmed publishes, confirmed acks.
    "throughput": Workload("throughput"),
    # A fixed, modest rate: the latency figures are the point (compare peers at 2,000/s).
    "latency": Workload("latency", rate=2000.0, window=2000, prefetch=100, ack_batch=50),
    # Many queues at once: per-queue bookkeeping and ownership spread over the brokers.
    "many-queues": Workload("many-queues", queues=50, window=500, prefetch=200, ack_batch=50),
    # A share of poison messages: always released (dead-lettered at the limit) or
    # rejected; the checker proves none is lost and none is delivered past its limit.
    "poison": Workload(
        "poison",
        queues=2,
        window=200,
        prefetch=200,
        ack_batch=50,
        release_share=0.05,
        reject_share=0.05,
        delivery_limit=3,
        dead_letter=True,
    ),
    # Work-queue semantics (Baton only): delayed messages and a retry policy for the
    # poison ones; the checker proves no message comes before its delay, no failed one
    # before its retry delay, and none is lost across the retries.
    "work-queue": Workload(
        "work-queue",
        queues=2,
        window=200,
        prefetch=50,
        ack_batch=25,
        release_share=0.05,
        reject_share=0.02,
        delivery_limit=3,
        dead_letter=True,
        delay_share=0.2,
        delay=0.5,
        retry_delay=0.2,
    ),
    # Publish with nobody consuming, then drain the backlog: how fast a queue that fell
    # behind catches up (the consume figure is the drain rate).
    "backlog-drain": Workload(
        "backlog-drain", window=1000, prefetch=1000, ack_batch=250, backlog=True
    ),
}


def get_preset(name: str, **overrides: object) -> Workload:
    """A preset, with some fields replaced (None values are ignored).

    Raises:
        KeyError: no such preset.
    """
    base = PRESETS[name]
    changes = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **changes)  # type: ignore[arg-type]


def spread(items: Sequence[str], parts: int, index: int) -> tuple[str, ...]:
    """Worker ``index``'s share of ``items`` (each item to at least one worker)."""
    if len(items) >= parts:
        return tuple(items[index::parts])
    return (items[index % len(items)],)


def rotate(addresses: list[str], i: int) -> tuple[str, ...]:
    """``addresses`` starting at the ``i``-th (each worker its own first broker)."""
    k = i % len(addresses)
    return tuple(addresses[k:] + addresses[:k])
