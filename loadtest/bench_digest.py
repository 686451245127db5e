"""Benchmark: the replica digest a checkpoint computes while it is applied (docs/design.md §8).

Every broker computes it at each checkpoint, in the apply path. It packs every queue's
index; ``State.digest`` packs again only the queues changed since the last digest and
reuses the others' bytes (the value is the same). This times both on states built in
memory, no broker, no disk:

* ``queues``: ``--queues`` queues, each with ``--held`` messages held by consumers (and
  as many redelivered ones), of which ``--changed`` change between two checkpoints;
* ``one-queue``: one queue with ``--held`` x ``--queues`` held messages, changed every
  time (what the cache cannot save: the same cost both ways).

    python -m batonmq.loadtest.bench_digest --queues 1000 --held 100 --changed 1

Prints, per state, the median and worst of ``--rounds`` digests, packed afresh
(``cluster/snapshot.py``'s digest, as before the cache) and through the cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from batonmq.cluster import snapshot
from batonmq.cluster.queues import QueueState
from batonmq.cluster.state import State


def _state(queues: int, held: int) -> State:
    """Queues with ``held`` messages held and ``held`` redelivered ones each."""
    s = State()
    for i in range(queues):
        q = QueueState(
            f"q{i}", i, durable=True, max_length=None, overflow="drop-head",
            delivery_limit=20, dead_letter=None, message_ttl_ms=None, declared_by="n1/r1",
        )
        q.next_pos = q.cursor = 2 * held + 1000
        q.acquired = {p: f"n1/r1/{p % 8}" for p in range(held)}
        q.returned = list(range(held, 2 * held))
        q.counts = {p: 1 for p in range(held, 2 * held)}
        s.queues[q.name] = q
    return s


def _touch(s: State, names: list[str], n: int) -> None:
    """A checkpoint interval's worth of change: a message of each queue settled and
    another handed out (marked dirty, as the state's own moves do)."""
    for name in names:
        q = s.queues[name]
        p = min(q.acquired)
        del q.acquired[p]
        q.acquired[q.cursor] = "n1/r1/0"
        q.cursor += 1
        q.accepted += 1
        s.dirty.add(name)
    s.take_dirty()  # the driver stores each batch's changes


def _time(fn: Callable[[], str], before: Callable[[], None], rounds: int) -> tuple[float, float, str]:
    took = []
    value = ""
    for _ in range(rounds):
        before()
        t = time.perf_counter()
        value = fn()
        took.append(time.perf_counter() - t)
    return statistics.median(took) * 1000, max(took) * 1000, value


def run(queues: int, held: int, changed: int, rounds: int) -> dict[str, object]:
    results: dict[str, object] = {}
    for name, state in (
        ("queues", _state(queues, held)),
        ("one-queue", _state(1, held * queues)),
    ):
        names = sorted(state.queues)[: max(1, changed)]
        state.digest()  # the first checkpoint packs everything
        afresh = _time(lambda: snapshot.digest(state), lambda: _touch(state, names, 1), rounds)
        cached = _time(state.digest, lambda: _touch(state, names, 1), rounds)
        assert cached[2] == snapshot.digest(state)
        results[name] = {
            "queues": len(state.queues),
            "messages_per_queue": 2 * (held if len(state.queues) > 1 else held * queues),
            "changed": len(names),
            "afresh_ms_median": round(afresh[0], 2),
            "afresh_ms_max": round(afresh[1], 2),
            "cached_ms_median": round(cached[0], 2),
            "cached_ms_max": round(cached[1], 2),
        }
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--queues", type=int, default=1000)
    p.add_argument("--held", type=int, default=100, help="held (and redelivered) messages per queue")
    p.add_argument("--changed", type=int, default=1, help="queues changed between two digests")
    p.add_argument("--rounds", type=int, default=9)
    a = p.parse_args()
    print(json.dumps(run(a.queues, a.held, a.changed, a.rounds), indent=2))


if __name__ == "__main__":
    main()
