"""The placement simulator: the replica-group planner on big virtual clusters
(``python -m batonmq.loadtest.sim_placement``; docs/design.md §16, docs/operations.md).

A discrete-event simulation that runs the real planner (``batonmq.cluster.assignment``)
on a virtual cluster of ``--brokers`` brokers and ``--partitions`` data partitions, each
replicated ``--replicas`` times. Time is in whole seconds (ticks); nothing sleeps.

- At start the leader's first plan assigns every partition, ready at once (no copy).
- ``--events`` seeded random events, ``--gap`` seconds apart on average: a *join* (a new
  broker), a *kill* (a broker goes down: kept in its groups, and *gone* after
  ``--replace-after`` seconds, then replaced), or a *restart* of a down broker within that
  delay (it must move nothing). A kill leaves at least ``--replicas`` brokers up; the
  cluster has at most 100 brokers up.
- The leader calls ``plan`` whenever something changed (an event, a broker gone, a copy
  done) and on the next tick after a plan that had steps; idle ticks are skipped, as the
  planner is deterministic and would plan the same nothing. An ``add`` queues a copy on
  its broker, which copies at most ``--copies`` partitions at once, each in
  size / ``--bandwidth`` seconds (partition sizes are seeded, 0.5-1.5 x ``--size`` MB), from a
  live replica (or from the log when none is left: an *orphan*); the joining node is then
  made ``ready``. A broker that goes down stops its copies (they start over when it is
  back).

A copy counts for the event that caused it: a replacement for the kill of the gone
broker it replaces, a rebalancing move for the latest event. *Full replication* after an
event is the first moment every partition has R ready replicas on live brokers, nothing
joining or leaving, and the planner plans nothing.

Prints a table (per event: time, kind, broker, partitions and MB copied, time to full
replication) and a summary: partitions per broker at the end (max, mean), data moved,
time to full replication (p50, max), whether every partition is back at R ready replicas.
``--json`` prints the figures as JSON instead (``--json FILE`` writes them and prints the
table); ``--plot FILE.png`` draws partitions per broker and the copies over time
(matplotlib). Exit status 1 if the cluster did not converge.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from batonmq.cluster.assignment import Group, Step, apply_step, effective_r, holders, orphans, plan, ready

__all__ = ["Options", "Outcome", "simulate", "main"]

#: The most brokers up at once (a join is not chosen beyond it).
MAX_BROKERS = 100
#: Virtual seconds the cluster is given to converge after its last event, past the
#: replace delay.
SETTLE_LIMIT = 100_000

Kind = Literal["join", "kill", "restart"]


@dataclass(frozen=True, slots=True)
class Options:
    """One simulation's settings (the command's options)."""

    brokers: int = 30
    partitions: int = 300
    replicas: int = 3
    events: int = 20
    seed: int = 1
    replace_after: int = 300
    gap: int = 200
    size: float = 1024.0
    bandwidth: float = 100.0
    copies: int = 2
    max_moves: int | None = None


@dataclass(slots=True)
class EventRow:
    """One random event and what followed it."""

    t: int
    kind: Kind
    broker: str
    copied: int = 0
    copied_mb: float = 0.0
    full_after: int | None = None  # seconds to full replication; None: never


@dataclass(slots=True)
class Sample:
    """The cluster at one moment (for the plot)."""

    t: int
    min: int
    mean: float
    max: int
    copying: int  # copies running or waiting
    copied: int  # copies done so far


@dataclass(slots=True)
class Outcome:
    """What a simulation found."""

    options: Options
    events: list[EventRow]
    brokers_end: int
    max_per_broker: int
    min_per_broker: int
    mean_per_broker: float
    copied: int
    copied_mb: float
    full_after_p50: float | None
    full_after_max: int | None
    restart_copies: int  # copies that followed restarts
    quiet_restarts: int  # restarts of a kill on a settled cluster, nothing else between
    quiet_restart_copies: int  # of those, after restarts of a kill on a settled cluster
    # with no other event until the restart: must be 0 (a restart moves nothing)
    orphaned: list[int]  # partitions whose every replica was gone at some point
    converged: bool
    ok: bool  # converged, and the quiet restarts copied nothing
    ended_at: int
    wall_seconds: float
    samples: list[Sample] = field(default_factory=list)

    @property
    def max_over_mean(self) -> float:
        return self.max_per_broker / self.mean_per_broker if self.mean_per_broker else 0.0

    def to_json(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        del out["samples"]
        out["max_over_mean"] = round(self.max_over_mean, 4)
        return out


@dataclass(slots=True)
class _Broker:
    name: str
    state: Literal["up", "down", "gone"] = "up"
    down_since: int = 0
    active: dict[int, int] = field(default_factory=dict)  # partition -> done at
    waiting: list[int] = field(default_factory=list)  # partitions, first come first


class _Sim:
    """The virtual cluster and the leader that plans for it."""

    def __init__(self, o: Options) -> None:
        self.o = o
        self.rng = random.Random(o.seed)
        self.brokers: dict[str, _Broker] = {}  # in join order: the members' order
        self.next_name = 1
        for _ in range(o.brokers):
            self._new_broker()
        self.size = {p: o.size * self.rng.uniform(0.5, 1.5) for p in range(1, o.partitions + 1)}
        self.groups: dict[int, Group] = {}
        self.cause: dict[tuple[int, str], int] = {}  # (partition, node) -> event index; -1: none
        self.killed_by: dict[str, int] = {}  # broker -> the event that killed it
        self.events: list[EventRow] = []
        self.unsettled: list[int] = []  # events not yet followed by full replication
        self.calm: list[bool] = []  # per event: the cluster was fully replicated before it
        self.copied = 0
        self.copied_mb = 0.0
        self.orphaned: set[int] = set()
        self.samples: list[Sample] = []
        self.dirty = True

    def _new_broker(self) -> str:
        name = f"b{self.next_name:03d}"
        self.next_name += 1
        self.brokers[name] = _Broker(name)
        return name

    def members(self) -> list[str]:
        return [b.name for b in self.brokers.values() if b.state == "up"]

    def gone(self) -> frozenset[str]:
        return frozenset(b.name for b in self.brokers.values() if b.state == "gone")

    # --- events -----------------------------------------------------------------------

    def event(self, t: int) -> None:
        up = self.members()
        down = [b.name for b in self.brokers.values() if b.state == "down"]
        kinds: list[Kind] = []
        if len(up) < MAX_BROKERS:
            kinds.append("join")
        if len(up) > self.o.replicas:
            kinds.append("kill")
        if down:
            kinds.append("restart")
        kind = self.rng.choice(kinds)
        if kind == "join":
            name = self._new_broker()
        elif kind == "kill":
            name = self.rng.choice(up)
            broker = self.brokers[name]
            broker.state, broker.down_since = "down", t
            for p in sorted(broker.active):  # its copies stop; they start over when it is back
                broker.waiting.insert(0, p)
            broker.active.clear()
            self.killed_by[name] = len(self.events)
        else:
            name = self.rng.choice(down)
            self.brokers[name].state = "up"
        self.events.append(EventRow(t, kind, name))
        self.calm.append(not self.unsettled)
        self.unsettled.append(len(self.events) - 1)
        self.dirty = True

    def expire(self, t: int) -> None:
        for b in self.brokers.values():
            if b.state == "down" and t >= b.down_since + self.o.replace_after:
                b.state = "gone"
                b.waiting.clear()
                self.dirty = True

    # --- copies -----------------------------------------------------------------------

    def finish_copies(self, t: int) -> None:
        for b in self.brokers.values():
            for p, done in sorted(b.active.items()):
                if done <= t:
                    del b.active[p]
                    self.groups = ready(self.groups, p, b.name)
                    mb = self.size[p]
                    self.copied += 1
                    self.copied_mb += mb
                    who = self.cause.pop((p, b.name), -1)
                    if who >= 0:
                        self.events[who].copied += 1
                        self.events[who].copied_mb += mb
                    self.dirty = True

    def _has_source(self, p: int) -> bool:
        """A live ready replica to copy from, or none left that is not gone (the log)."""
        replicas = self.groups[p].replicas
        states = [self.brokers[n].state for n in replicas]
        return "up" in states or "down" not in states

    def start_copies(self, t: int) -> None:
        for b in self.brokers.values():
            if b.state != "up":
                continue
            for p in list(b.waiting):
                if len(b.active) >= self.o.copies:
                    break
                if self._has_source(p):
                    b.waiting.remove(p)
                    b.active[p] = t + max(1, math.ceil(self.size[p] / self.o.bandwidth))

    def _cancel(self, p: int, node: str) -> None:
        b = self.brokers[node]
        b.active.pop(p, None)
        if p in b.waiting:
            b.waiting.remove(p)
        self.cause.pop((p, node), None)

    # --- the leader -------------------------------------------------------------------

    def lead(self) -> list[Step]:
        gone = self.gone()
        self.orphaned.update(p for p in orphans(self.groups, gone) if self.groups[p].replicas)
        steps = plan(self.o.partitions, self.o.replicas, self.members(), self.groups, gone,
                     max_moves=self.o.max_moves)
        latest = len(self.events) - 1
        replaced: dict[int, int] = {}
        for step in steps:
            self.groups = apply_step(self.groups, step)
            node = step.nodes[0]
            if step.kind == "remove":
                self._cancel(step.partition, node)
                if node in gone:
                    replaced[step.partition] = self.killed_by.get(node, latest)
            elif step.kind == "add":
                self.brokers[node].waiting.append(step.partition)
                who = latest if step.instead is not None else replaced.get(step.partition, latest)
                self.cause[(step.partition, node)] = who
        return steps

    def settled(self) -> bool:
        members = self.members()
        r = effective_r(self.o.replicas, members)
        for p in range(1, self.o.partitions + 1):
            g = self.groups.get(p)
            if g is None or g.joining or g.leaving or len(g.replicas) != r:
                return False
            if any(self.brokers[n].state != "up" for n in g.replicas):
                return False
        return not plan(self.o.partitions, self.o.replicas, members, self.groups, self.gone(),
                        max_moves=self.o.max_moves)

    def held(self) -> list[int]:
        counts = {m: 0 for m in self.members()}
        for g in self.groups.values():
            for n in holders(g):
                if n in counts:
                    counts[n] += 1
        return list(counts.values())

    def sample(self, t: int) -> None:
        held = self.held() or [0]
        copying = sum(len(b.active) + len(b.waiting) for b in self.brokers.values() if b.state != "gone")
        self.samples.append(Sample(t, min(held), sum(held) / len(held), max(held), copying, self.copied))

    def next_time(self, t: int, event_at: Sequence[int], next_event: int) -> int | None:
        times: list[int] = []
        if next_event < len(event_at):
            times.append(event_at[next_event])
        for b in self.brokers.values():
            if b.state == "down":
                times.append(b.down_since + self.o.replace_after)
            times.extend(b.active.values())
        if self.dirty:
            times.append(t + 1)
        later = [x for x in times if x > t]
        return min(later) if later else None


def simulate(o: Options) -> Outcome:
    """Run one simulation.

    Raises:
        ValueError: an option out of range.
    """
    _check(o)
    started = time.monotonic()
    sim = _Sim(o)
    event_at: list[int] = []
    at = 0
    for _ in range(o.events):
        at += max(1, round(sim.rng.uniform(0.5, 1.5) * o.gap))
        event_at.append(at)
    limit = (event_at[-1] if event_at else 0) + o.replace_after + SETTLE_LIMIT
    t, next_event, converged = 0, 0, False
    while True:
        while next_event < len(event_at) and event_at[next_event] <= t:
            sim.event(t)
            next_event += 1
        sim.expire(t)
        sim.finish_copies(t)
        sim.dirty = bool(sim.lead())  # planned: look again next tick
        sim.start_copies(t)
        sim.sample(t)
        if sim.unsettled or next_event >= len(event_at):
            if sim.settled():
                for i in sim.unsettled:
                    sim.events[i].full_after = t - sim.events[i].t
                sim.unsettled.clear()
                if next_event >= len(event_at) and not any(
                    b.state == "down" for b in sim.brokers.values()
                ):
                    converged = True
                    break
        nxt = sim.next_time(t, event_at, next_event)
        if nxt is None or nxt > limit:
            break
        t = nxt
    held = sim.held() or [0]
    quiet_ones = _quiet_restarts(sim.events, sim.calm)
    quiet = sum(sim.events[i].copied for i in quiet_ones)
    fulls = sorted(e.full_after for e in sim.events if e.full_after is not None)
    return Outcome(
        options=o,
        events=sim.events,
        brokers_end=len(sim.members()),
        max_per_broker=max(held),
        min_per_broker=min(held),
        mean_per_broker=round(sum(held) / len(held), 3),
        copied=sim.copied,
        copied_mb=round(sim.copied_mb, 1),
        full_after_p50=_median(fulls),
        full_after_max=fulls[-1] if fulls else None,
        restart_copies=sum(e.copied for e in sim.events if e.kind == "restart"),
        quiet_restarts=len(quiet_ones),
        quiet_restart_copies=quiet,
        orphaned=sorted(sim.orphaned),
        converged=converged and all(e.full_after is not None for e in sim.events),
        ok=converged and quiet == 0 and all(e.full_after is not None for e in sim.events),
        ended_at=t,
        wall_seconds=round(time.monotonic() - started, 3),
        samples=sim.samples,
    )


def _quiet_restarts(events: Sequence[EventRow], calm: Sequence[bool]) -> list[int]:
    """The restarts that directly follow their broker's kill, which came on a fully
    replicated cluster: nothing but the restart can explain what they copy."""
    return [
        i for i, e in enumerate(events)
        if e.kind == "restart" and i > 0 and events[i - 1].kind == "kill"
        and events[i - 1].broker == e.broker and calm[i - 1]
    ]


def _median(xs: Sequence[int]) -> float | None:
    if not xs:
        return None
    mid = len(xs) // 2
    return float(xs[mid]) if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def _check(o: Options) -> None:
    problems = []
    if not 3 <= o.brokers <= MAX_BROKERS:
        problems.append(f"--brokers must be 3 to {MAX_BROKERS}")
    if not 1 <= o.partitions <= 1000:
        problems.append("--partitions must be 1 to 1000")
    if not 1 <= o.replicas <= o.brokers:
        problems.append("--replicas must be 1 to --brokers")
    if o.events < 0:
        problems.append("--events must not be negative")
    if o.replace_after < 1 or o.gap < 1 or o.copies < 1:
        problems.append("--replace-after, --gap and --copies must be positive")
    if o.size <= 0 or o.bandwidth <= 0:
        problems.append("--size and --bandwidth must be positive")
    if o.max_moves is not None and o.max_moves < 1:
        problems.append("--max-moves must be positive")
    if problems:
        raise ValueError("; ".join(problems))


# --- output -------------------------------------------------------------------------------


def _secs(x: float | None) -> str:
    return "never" if x is None else f"{x:g}s"


def show(out: Outcome) -> None:
    """Print the table and the summary."""
    o = out.options
    print(f"{o.brokers} brokers, {o.partitions} partitions, R={o.replicas}, {o.events} events "
          f"(seed {o.seed}, replace after {o.replace_after}s, partitions of ~{o.size:g} MB, "
          f"{o.bandwidth:g} MB/s per copy, {o.copies} copies per broker at once)")
    print(f"{'time':>7}  {'event':<8} {'broker':<6} {'copied':>6} {'MB':>9}  full replication after")
    for e in out.events:
        print(f"{e.t:>6}s  {e.kind:<8} {e.broker:<6} {e.copied:>6} {e.copied_mb:>9.0f}  {_secs(e.full_after)}")
    print(f"partitions per broker at the end: max {out.max_per_broker}, mean {out.mean_per_broker:g}, "
          f"min {out.min_per_broker} (max/mean {out.max_over_mean:.2f}) over {out.brokers_end} brokers")
    print(f"data moved: {out.copied} partitions copied, {out.copied_mb:.0f} MB "
          f"({out.restart_copies} after restarts, {out.quiet_restart_copies} after a restart alone)")
    print(f"time to full replication after an event: p50 {_secs(out.full_after_p50)}, "
          f"max {_secs(out.full_after_max)}")
    if out.orphaned:
        print(f"partitions left with no replica to copy from (replayed from the log): {out.orphaned}")
    state = "yes" if out.converged else "NO"
    print(f"every partition back at R={min(o.replicas, out.brokers_end)} ready replicas: {state} (simulated {out.ended_at}s in {out.wall_seconds:.1f}s)")


def plot(out: Outcome, path: str) -> None:
    """Partitions per broker and the copies over time, with the events marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = [s.t for s in out.samples]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    top.step(ts, [s.max for s in out.samples], where="post", label="max", linewidth=1.2)
    top.step(ts, [s.mean for s in out.samples], where="post", label="mean", linewidth=1.2)
    top.step(ts, [s.min for s in out.samples], where="post", label="min", linewidth=1.2)
    top.set_ylabel("partitions per broker")
    bottom.step(ts, [s.copying for s in out.samples], where="post", label="copies running or waiting")
    bottom.step(ts, [s.copied for s in out.samples], where="post", label="partitions copied (total)")
    bottom.set_ylabel("partitions")
    bottom.set_xlabel("simulated seconds")
    colors: Mapping[str, str] = {"join": "tab:green", "kill": "tab:red", "restart": "tab:blue"}
    for ax in (top, bottom):
        for e in out.events:
            ax.axvline(e.t, color=colors[e.kind], linestyle="--", linewidth=0.7, alpha=0.7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    o = out.options
    fig.suptitle(f"{o.brokers} brokers, {o.partitions} partitions, R={o.replicas}, {o.events} events "
                 "(dashed: green join, red kill, blue restart)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m batonmq.loadtest.sim_placement", description=__doc__.split("\n\n")[0],
    )
    d = Options()
    p.add_argument("--brokers", type=int, default=d.brokers, help=f"brokers at start, 3 to {MAX_BROKERS} ({d.brokers})")
    p.add_argument("--partitions", type=int, default=d.partitions, help=f"data partitions, 1 to 1000 ({d.partitions})")
    p.add_argument("--replicas", type=int, default=d.replicas, help=f"R, replicas per partition ({d.replicas})")
    p.add_argument("--events", type=int, default=d.events, help=f"random joins, kills and restarts ({d.events})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"the random seed ({d.seed})")
    p.add_argument("--replace-after", type=int, default=d.replace_after,
                   help=f"seconds a killed broker is down before it is replaced ({d.replace_after})")
    p.add_argument("--gap", type=int, default=d.gap, help=f"mean seconds between events ({d.gap})")
    p.add_argument("--size", type=float, default=d.size, help=f"mean partition size, MB ({d.size:g})")
    p.add_argument("--bandwidth", type=float, default=d.bandwidth, help=f"MB/s of one copy ({d.bandwidth:g})")
    p.add_argument("--copies", type=int, default=d.copies, help=f"copies a broker runs at once ({d.copies})")
    p.add_argument("--max-moves", type=int, default=None,
                   help="rebalancing moves in flight at once (default: the planner's, half the brokers)")
    p.add_argument("--plot", metavar="FILE.png", help="draw partitions per broker and the copies over time")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="print the figures as JSON (or write them to FILE and print the table)")
    args = p.parse_args(argv)
    options = Options(
        brokers=args.brokers, partitions=args.partitions, replicas=args.replicas, events=args.events,
        seed=args.seed, replace_after=args.replace_after, gap=args.gap, size=args.size,
        bandwidth=args.bandwidth, copies=args.copies, max_moves=args.max_moves,
    )
    try:
        out = simulate(options)
    except ValueError as exc:
        p.error(str(exc))
    if args.plot:
        plot(out, args.plot)
    if args.json == "-":
        json.dump(out.to_json(), sys.stdout, indent=2)
        print()
    else:
        show(out)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out.to_json(), f, indent=2)
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main())
