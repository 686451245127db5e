"""Fault schedules and the fault injector of a load-test run.

A schedule is written ``--faults SPEC``::

    SPEC   := GROUP (";" GROUP)*
    GROUP  := KINDS "@" WHEN
    KINDS  := KIND[":" SECONDS] ("," KIND[":" SECONDS])*
    WHEN   := SECONDS                every SECONDS, the kinds in turn (first at SECONDS)
            | "random:" SECONDS      about every SECONDS (uniform 0.5x..1.5x), a kind and a
                                     broker picked at random with the run's --seed
            | "at:" SECONDS ("," SECONDS)*   at these times, the kinds in turn
    SECONDS:= a number with an optional unit: 500ms, 30s, 2m (plain numbers are seconds)

for example ``kill9,sigstop,join@30s``, ``sigstop:8@random:20s``, ``kill9@at:10,40``,
``grow@at:10; kill9-replicas@at:30``.
A kind's ``:SECONDS`` is how long the fault lasts (see :data:`KINDS`). Times count from
the start of the load; faults past the duration are dropped. Faults never overlap:
one that is due while another still runs waits for it (its record has the real time).

Kinds:

- ``kill9``: ``kill -9`` a running broker, wait, restart it on its data dir and port;
- ``sigstop``: SIGSTOP a running broker, wait, SIGCONT it;
- ``join``: start a new broker on a fresh data dir on the same log and wait until the
  view lists it; the broker an earlier ``join`` added is stopped first (SIGTERM), so the
  cluster has at most one broker more than it started with;
- ``grow``: start a new broker as ``join`` does, and keep it for the rest of the run
  (a later ``join`` never stops it). On a cluster with replica groups the fault ends
  when the new broker is a caught-up replica of a partition: the planner's, or, when
  the groups are balanced without it, one move the fault asks for
  (:meth:`BatonCluster.move_replica`, as ``baton partitions move`` does);
- ``kill9-replicas``: ``kill -9``, at once, one replica of each data partition's group
  (read from a broker's topology), never more than a minority of any group
  (:func:`replica_victims`), wait, restart them all; with no replica groups (one log,
  or every broker in every group) it kills one broker, and its records say so;
- ``kafka-restart``: stop the Kafka broker the harness started (``--log kafka``), wait,
  start it again;
- ``diskfull``: fill the size-limited filesystem of the data dirs and the file log
  (``--disk-limit``) to ENOSPC, keep it full, free it;
- ``netsplit``: cut one broker from its clients and, with Kafka, from the log, then heal
  (through Toxiproxy, :mod:`batonmq.loadtest.netfaults`; peer links cannot be routed:
  docs/loadtest.md "Network faults");
- ``client-partition``: cut one broker's clients from it (the broker stays in the
  cluster), then heal;
- ``slow-net``: latency and jitter on every proxied link, then heal;
- ``clockjump``: step one broker's wall clock 5 minutes forwards, then 5 minutes
  backwards, then run it at 3x speed, each for a third of the duration, then set it
  right (libfaketime; the monotonic clock is left alone, as by NTP);
- ``bitflip`` / ``truncate``: stop a broker cleanly, flip bytes in / cut its newest store
  file (an SST), start it again: it must set the damaged store aside and join afresh
  (the fault ends when it is a member again);
- ``upgrade`` (needs ``--old-build``, which starts the brokers on another build): stop
  the next broker still on the old build cleanly (SIGTERM, and wait for its exit),
  start it on the running build on the same data dir, log and ports; the fault ends
  when it is a member of the view again. With no old broker left it does nothing (its
  records say ``none left``);
- ``enable-features``: enable every feature flag through a running broker (the
  client's ``enable_features()``); the fault ends when every running broker lists them
  all enabled.

Composite kinds (their parts are recorded as the parts' own faults, so the checker
treats them as it treats those):

- ``kill9-while-paused``: SIGSTOP one broker, ``kill -9`` another while it is paused,
  restart the killed one after the duration, then resume the paused one;
- ``netsplit-during-join``: start a ``join`` and, while the new broker gets its update,
  ``netsplit`` a member for the duration.

The network kinds make the harness start Toxiproxy and connect the workers (and the
brokers' Kafka clients) through it (:data:`NET_KINDS`).

Every fault writes two ``fault`` records to ``faults.hist`` (count 0 when it starts,
1 when it is over; ``info`` names the broker); the checker ends the holds of consumers
connected to a broker that a fault took away (``kill9``, ``sigstop``, a cut, a clean stop
as in ``bitflip``, ``truncate`` and ``upgrade``: :data:`batonmq.loadtest.checker.BROKER_DOWN_FAULTS`).
"""

from __future__ import annotations

import random
import re
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batonmq.loadtest.cluster import BatonCluster, Broker
from batonmq.loadtest.history import HistoryWriter, OpKind

__all__ = [
    "KINDS",
    "FaultEvent",
    "FaultSpecError",
    "parse_faults",
    "FaultInjector",
    "check_supported",
    "NET_KINDS",
    "replica_victims",
    "fault_line",
]

#: How long ``grow`` waits for the planner to give the new broker a partition before it
#: asks for a move, and for the new broker to be a caught-up replica (seconds).
GROW_PLAN_WAIT = 10.0
GROW_READY_WAIT = 120.0

#: Fault kinds and how long each lasts by default (seconds).
KINDS: dict[str, float] = {
    "kill9": 2.0,  # down before the restart
    "sigstop": 6.0,  # paused: longer than the default suspicion time (6 beats of 0.5 s)
    "join": 0.0,
    "grow": 0.0,
    "kill9-replicas": 2.0,  # down before the restart
    "kafka-restart": 3.0,  # Kafka down
    "diskfull": 8.0,  # kept full
    "netsplit": 8.0,  # cut: longer than the suspicion time
    "client-partition": 8.0,  # clients cut
    "slow-net": 10.0,  # slowed
    "bitflip": 0.0,
    "truncate": 0.0,
    "clockjump": 9.0,  # +5 min, -5 min, 3x speed: a third each
    "kill9-while-paused": 4.0,  # the killed one down, the paused one paused longer
    "netsplit-during-join": 6.0,  # the member cut
    "upgrade": 0.0,
    "enable-features": 0.0,
}

#: The wall-clock settings of a ``clockjump``, in turn (libfaketime's syntax).
CLOCK_STEPS = ("+300", "-300", "+0 x3")

#: Kinds that need the brokers behind Toxiproxy's proxies.
NET_KINDS = frozenset({"netsplit", "client-partition", "slow-net", "netsplit-during-join"})

FAULTS_ACTOR = "faults"


class FaultSpecError(ValueError):
    """A ``--faults`` spec that cannot be parsed."""


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """One scheduled fault.

    Attributes:
        at: seconds into the load phase.
        kind: one of :data:`KINDS`.
        duration: how long it lasts (seconds).
        pick: which broker, as an index into the running brokers (taken modulo their
            number when it is applied; None: in turn).
    """

    at: float
    kind: str
    duration: float
    pick: int | None = None


_SECONDS = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*$")


def _seconds(text: str) -> float:
    m = _SECONDS.match(text)
    if not m:
        raise FaultSpecError(f"not a time: {text!r} (use e.g. 500ms, 30s, 2m)")
    value = float(m.group(1))
    return value / 1000 if m.group(2) == "ms" else value * 60 if m.group(2) == "m" else value


def _kinds(text: str) -> list[tuple[str, float]]:
    out = []
    for item in text.split(","):
        name, _, dur = item.strip().partition(":")
        name = name.strip()
        if name not in KINDS:
            raise FaultSpecError(f"unknown fault {name!r} (known: {', '.join(KINDS)})")
        out.append((name, _seconds(dur) if dur else KINDS[name]))
    return out


def parse_faults(spec: str, duration: float, seed: int = 1) -> list[FaultEvent]:
    """The faults of a ``--faults`` spec (module doc) within ``duration`` s, by time.

    Raises:
        FaultSpecError: the spec cannot be parsed, or an interval is not positive.
    """
    events: list[FaultEvent] = []
    rng = random.Random(seed)
    for group in (g for g in spec.split(";") if g.strip()):
        kinds_text, at, when = group.partition("@")
        if not at:
            raise FaultSpecError(f"{group!r}: say when, e.g. {group.strip()}@30s")
        kinds = _kinds(kinds_text)
        when = when.strip()
        if when.startswith("at:"):
            times = [_seconds(t) for t in when[3:].split(",")]
            for i, t in enumerate(sorted(times)):
                kind, dur = kinds[i % len(kinds)]
                events.append(FaultEvent(t, kind, dur))
        elif when.startswith("random:"):
            mean = _seconds(when[7:])
            if mean <= 0:
                raise FaultSpecError(f"{group!r}: the interval must be positive")
            t = mean * rng.uniform(0.5, 1.5)
            while t < duration:
                kind, dur = kinds[rng.randrange(len(kinds))]
                events.append(FaultEvent(round(t, 3), kind, dur, rng.randrange(1 << 16)))
                t += mean * rng.uniform(0.5, 1.5)
        else:
            every = _seconds(when)
            if every <= 0:
                raise FaultSpecError(f"{group!r}: the interval must be positive")
            i = 0
            while (i + 1) * every < duration:
                kind, dur = kinds[i % len(kinds)]
                events.append(FaultEvent((i + 1) * every, kind, dur))
                i += 1
    return sorted((e for e in events if e.at < duration), key=lambda e: e.at)


@dataclass(slots=True)
class _Done:
    t: float
    kind: str
    phase: str
    detail: str


class FaultInjector(threading.Thread):
    """Applies a schedule to a :class:`BatonCluster` from a thread of the runner.

    Args:
        system: the cluster.
        events: the schedule (:func:`parse_faults`).
        history: path of ``faults.hist``.
        t0: ``time.monotonic()`` of the start of the load.
    """

    def __init__(
        self, system: BatonCluster, events: list[FaultEvent], history: str | Path, t0: float
    ) -> None:
        super().__init__(name="fault-injector", daemon=True)
        self.system = system
        self.events = list(events)
        self.history = history
        self.t0 = t0
        self.halt = threading.Event()
        #: What happened, for the progress line and the report (seconds since t0).
        self.log: list[_Done] = []
        self.errors: list[str] = []
        self._turn = 0
        self._joined: Broker | None = None

    def run(self) -> None:
        with HistoryWriter(self.history, FAULTS_ACTOR) as w:
            for ev in self.events:
                delay = self.t0 + ev.at - time.monotonic()
                if delay > 0 and self.halt.wait(delay):
                    break
                if self.halt.is_set():
                    break
                try:
                    self._apply(ev, w)
                except Exception as exc:  # noqa: BLE001 - a failed fault is reported, not fatal
                    self.errors.append(f"{ev.kind} at {ev.at:g}s: {type(exc).__name__}: {exc}")
                    w.record(OpKind.FAULT, msg=ev.kind, count=1, info=f"error={exc}")
                    traceback.print_exc()
                w.flush()

    def stop(self, timeout: float = 120.0) -> None:
        """Skip the faults not yet started, and wait for the running one to end."""
        self.halt.set()
        if self.is_alive():
            self.join(timeout)

    def _note(self, w: HistoryWriter, kind: str, phase: int, detail: str) -> None:
        w.record(OpKind.FAULT, msg=kind, count=phase, info=detail)
        w.flush()
        self.log.append(_Done(time.monotonic() - self.t0, kind, ("start", "end")[phase], detail))

    def _pick_broker(self, ev: FaultEvent, proxied: bool = False) -> Broker:
        """The broker to fault: in turn, or the event's random pick, among the running
        ones (behind the network proxies only, for a network fault)."""
        running = self.system.running()
        if proxied:
            running = [b for b in running if self.system.proxied(b)]
        if not running:
            raise RuntimeError(
                "no running broker behind the network proxies to fault" if proxied
                else "no running broker to fault"
            )
        if ev.pick is None:
            self._turn += 1
            return running[(self._turn - 1) % len(running)]
        return running[ev.pick % len(running)]

    def _apply(self, ev: FaultEvent, w: HistoryWriter) -> None:
        s = self.system
        if ev.kind in ("netsplit", "client-partition"):
            b = self._pick_broker(ev, proxied=True)
            # The workers' records name the proxy's address: the checker matches on it.
            detail = f"node={b.node_id} address={b.client_address or b.address}"
            self._note(w, ev.kind, 0, detail)
            if ev.kind == "netsplit":
                s.netsplit(b, ev.duration)
            else:
                s.client_partition(b, ev.duration)
            self._note(w, ev.kind, 1, detail)
        elif ev.kind in ("bitflip", "truncate"):
            b = self._pick_broker(ev)
            detail = f"node={b.node_id} address={b.client_address or b.address}"
            self._note(w, ev.kind, 0, detail)
            damaged = s.damage_store(b, ev.kind)
            self._note(w, ev.kind, 1, f"{detail} file={damaged}")
        elif ev.kind == "kill9-while-paused":
            paused = self._pick_broker(ev)
            others = [b for b in s.running() if b is not paused]
            if not others:
                raise RuntimeError("kill9-while-paused needs two running brokers")
            killed = others[0]
            self._note(w, ev.kind, 0, f"paused={paused.node_id} killed={killed.node_id}")
            p_detail = f"node={paused.node_id} address={paused.client_address or paused.address}"
            k_detail = f"node={killed.node_id} address={killed.client_address or killed.address}"
            self._note(w, "sigstop", 0, p_detail)
            s.pause(paused)
            try:
                time.sleep(0.5)  # pacing: the pause is under way before the kill
                self._note(w, "kill9", 0, k_detail)
                s.kill9(killed)
                time.sleep(ev.duration)
                s.restart(killed)
                self._note(w, "kill9", 1, k_detail)
            finally:
                s.resume(paused)
            self._note(w, "sigstop", 1, p_detail)
            self._note(w, ev.kind, 1, f"paused={paused.node_id} killed={killed.node_id}")
        elif ev.kind == "netsplit-during-join":
            if self._joined is not None and self._joined.state == "running":
                old = self._joined
                self._note(w, "stop", 0, f"node={old.node_id} address={old.address}")
                s.terminate(old)
                self._note(w, "stop", 1, f"node={old.node_id} address={old.address}")
            # After the stop: never the broker just stopped.
            member = self._pick_broker(ev, proxied=True)
            self._note(w, ev.kind, 0, f"cut={member.node_id}")
            joined: list[Broker] = []
            joiner = threading.Thread(target=lambda: joined.append(s.join()), daemon=True)
            self._note(w, "join", 0, "")
            joiner.start()
            detail = f"node={member.node_id} address={member.client_address or member.address}"
            self._note(w, "netsplit", 0, detail)
            s.netsplit(member, ev.duration)
            self._note(w, "netsplit", 1, detail)
            joiner.join(120)
            if not joined:
                raise RuntimeError("the join under a netsplit did not finish")
            self._joined = joined[0]
            self._note(w, "join", 1, f"node={joined[0].node_id} address={joined[0].address}")
            self._note(w, ev.kind, 1, f"cut={member.node_id} joined={joined[0].node_id}")
        elif ev.kind == "clockjump":
            b = self._pick_broker(ev)
            detail = f"node={b.node_id} address={b.client_address or b.address}"
            view = s.view_of(b)
            self._note(w, ev.kind, 0, f"{detail} view={view}")
            try:
                for spec in CLOCK_STEPS:
                    s.set_clock(b, spec)
                    time.sleep(ev.duration / len(CLOCK_STEPS))
            finally:
                s.set_clock(b, "+0")
            # The same view after it: nobody was suspected or dropped meanwhile.
            self._note(w, ev.kind, 1, f"{detail} view={s.view_of(b)}")
        elif ev.kind == "slow-net":
            self._note(w, ev.kind, 0, "")
            s.slow_net(ev.duration)
            self._note(w, ev.kind, 1, "")
        elif ev.kind in ("kill9", "sigstop"):
            b = self._pick_broker(ev)
            detail = f"node={b.node_id} address={b.client_address or b.address}"
            # The record goes first: the checker ends the holds of the broker's
            # consumers at this time, before the cluster can give them back.
            self._note(w, ev.kind, 0, detail)
            if ev.kind == "kill9":
                s.kill9(b)
                self.halt.wait(ev.duration)
                s.restart(b)
            else:
                s.pause(b)
                time.sleep(min(0.05, ev.duration))
                # Worth knowing: a broker paused while it holds the file log's append
                # lock stalls every other broker's appends until it resumes.
                if b.proc is not None and _holds_flock(b.proc.pid):
                    detail += " held_log_lock=yes"
                time.sleep(max(0.0, ev.duration - 0.05))  # never cut short: it must resume
                s.resume(b)
            self._note(w, ev.kind, 1, detail)
        elif ev.kind == "join":
            if self._joined is not None and self._joined.state == "running":
                old = self._joined
                self._note(w, "stop", 0, f"node={old.node_id} address={old.address}")
                s.terminate(old)
                self._note(w, "stop", 1, f"node={old.node_id} address={old.address}")
            self._note(w, "join", 0, "")
            b = s.join()
            self._joined = b
            self._note(w, "join", 1, f"node={b.node_id} address={b.address}")
        elif ev.kind == "grow":
            self._grow(w)
        elif ev.kind == "kill9-replicas":
            self._kill9_replicas(ev, w)
        elif ev.kind == "upgrade":
            on_old = s.old_brokers()
            if not on_old:
                # Every broker runs the new build already: nothing to do, said so.
                self._note(w, ev.kind, 0, "none left")
                self._note(w, ev.kind, 1, "none left")
                return
            b = on_old[0] if ev.pick is None else on_old[ev.pick % len(on_old)]
            detail = f"node={b.node_id} address={b.client_address or b.address}"
            # The record goes first: the checker ends the holds of the broker's
            # consumers at this time, before the cluster can give them back.
            self._note(w, ev.kind, 0, detail)
            code = s.upgrade(b)
            self._note(w, ev.kind, 1, f"{detail} exit={code} old_left={len(s.old_brokers())}")
            if code != 0:
                raise RuntimeError(f"{b.node_id} on the old build did not stop cleanly"
                                   f" (exit status {code})")
        elif ev.kind == "enable-features":
            b = self._pick_broker(ev)
            detail = f"node={b.node_id} address={b.client_address or b.address}"
            self._note(w, ev.kind, 0, detail)
            newly, names = s.enable_features(b)
            self._note(w, ev.kind, 1, f"{detail} enabled={','.join(newly) or '-'}"
                                      f" features={','.join(names) or '-'}")
        elif ev.kind == "kafka-restart":
            self._note(w, ev.kind, 0, "")
            s.kafka_restart(ev.duration)
            self._note(w, ev.kind, 1, "")
        elif ev.kind == "diskfull":
            self._note(w, ev.kind, 0, "")
            written = s.fill_disk(ev.duration)
            self._note(w, ev.kind, 1, f"filled={written}")
        else:  # pragma: no cover - parse_faults only makes known kinds
            raise RuntimeError(f"unknown fault {ev.kind}")

    def _grow(self, w: HistoryWriter) -> None:
        """A ``join`` whose broker stays; with replica groups, until it replicates a
        partition (module doc)."""
        s = self.system
        self._note(w, "grow", 0, "")
        b = s.join()
        detail = f"node={b.node_id} address={b.address}"
        rows = s.groups()
        if not rows:
            self._note(w, "grow", 1, f"{detail} no replica groups")
            return
        moved = ""
        deadline = time.monotonic() + GROW_PLAN_WAIT
        while not _held_by(rows, b.node_id) and time.monotonic() < deadline:
            time.sleep(0.25)  # polling the planner, which runs once a second
            rows = s.groups()
        if not _held_by(rows, b.node_id):
            # Balanced without it (no broker holds two more than another): one move
            # onto it, from the last replica of the first group, as an operator does.
            row = rows[0]
            source = str(row["replicas"][-1])
            s.move_replica(int(row["partition"]), source, b.node_id)
            moved = f" moved={row['partition']}:{source}"
        deadline = time.monotonic() + GROW_READY_WAIT
        while not (mine := _replicated_by(rows, b.node_id)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{b.node_id} replicates no partition after"
                                   f" {GROW_READY_WAIT:g}s (groups {rows})")
            time.sleep(0.25)  # polling: its join update and ReplicaReady
            rows = s.groups()
        self._note(w, "grow", 1, f"{detail} partitions={','.join(map(str, mine))}{moved}")

    def _kill9_replicas(self, ev: FaultEvent, w: HistoryWriter) -> None:
        """``kill -9`` one replica of each group at once (module doc)."""
        s = self.system
        rows = s.groups()
        running = [b.node_id for b in s.running()]
        if not rows or all(set(running) <= set(r["replicas"]) for r in rows):
            victims = [self._pick_broker(ev)]
            why = "no replica groups: one broker"
        else:
            by_id = {b.node_id: b for b in s.running()}
            victims = [by_id[n] for n in replica_victims(rows, running)]
            why = "one replica of each group"
            if not victims:
                raise RuntimeError(f"no replica can be killed without a majority of its"
                                   f" group (groups {rows})")
        parts = {b.node_id: [int(r["partition"]) for r in rows if b.node_id in r["replicas"]]
                 for b in victims}
        killed = " ".join(f"{n}:{','.join(map(str, p)) or '-'}" for n, p in parts.items())
        self._note(w, ev.kind, 0, f"killed={killed} ({why})")
        details = [f"node={b.node_id} address={b.client_address or b.address}" for b in victims]
        # The records go first: the checker ends the holds of their consumers at this
        # time, before the cluster can give them back.
        for d in details:
            self._note(w, "kill9", 0, d)
        down = time.monotonic()
        for b in victims:
            s.kill9(b)
        self.halt.wait(ev.duration)
        s.restart_many(victims)
        back = time.monotonic() - down
        for d in details:
            self._note(w, "kill9", 1, d)
        self._note(w, ev.kind, 1, f"killed={killed} back_after={back:.1f}s ({why})")

    def summary(self) -> list[dict[str, Any]]:
        """The faults applied, as JSON-ready mappings."""
        return [
            {"t": round(d.t, 3), "kind": d.kind, "phase": d.phase, "detail": d.detail}
            for d in self.log
        ]


def replica_victims(groups: list[dict[str, Any]], running: list[str]) -> list[str]:
    """The brokers a ``kill9-replicas`` kills: one replica of each data partition's group,
    in partition order (a broker already picked covers each group it is in), never so
    many that a group keeps no live majority of its replicas.

    Args:
        groups: topology ``groups`` rows (``partition``, ``replicas``: node ids).
        running: node ids of the running brokers (a replica not among them is down
            already and counts against its group's majority).

    Returns:
        Node ids, in the order picked (a group of one or two replicas gets none).
    """
    victims: list[str] = []

    def fits(trial: list[str]) -> bool:
        for row in groups:
            replicas = [str(n) for n in row["replicas"]]
            down = sum(1 for n in replicas if n in trial or n not in running)
            if down > (len(replicas) - 1) // 2:
                return False
        return True

    for row in sorted(groups, key=lambda r: int(r["partition"])):
        replicas = [str(n) for n in row["replicas"]]
        if any(v in replicas for v in victims):
            continue
        for node in replicas:
            if node in running and fits([*victims, node]):
                victims.append(node)
                break
    return victims


def _held_by(rows: list[dict[str, Any]], node: str) -> bool:
    return any(node in r["replicas"] or node in r.get("joining", ()) for r in rows)


def _replicated_by(rows: list[dict[str, Any]], node: str) -> list[int]:
    return [int(r["partition"]) for r in rows if node in r["replicas"]]


def fault_line(faults: list[dict[str, Any]]) -> str:
    """The report's one line of the faults applied (``metrics.faults``): each start, with
    its broker, or, for ``grow`` and ``kill9-replicas``, with its end note."""
    ends = [f for f in faults if f["phase"] == "end"]
    out = []
    for f in (f for f in faults if f["phase"] == "start"):
        text = f"{f['kind']}@{f['t']:.0f}s"
        if f["detail"].startswith("node="):
            text += f"({f['detail'].split()[0][5:]})"
        elif f["kind"] in ("grow", "kill9-replicas"):
            end = next((e for e in ends if e["kind"] == f["kind"] and e["t"] >= f["t"]), None)
            text += f"({end['detail'] if end else 'not over'})"
        out.append(text)
    return "faults: " + ", ".join(out)


def _holds_flock(pid: int) -> bool:
    """Whether the process holds an exclusive flock (Linux ``/proc/locks``)."""
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 12345 fd:01:1234 0 EOF"
                if len(parts) > 4 and parts[1] == "FLOCK" and parts[3] == "WRITE" \
                        and parts[4] == str(pid):
                    return True
    except OSError:
        pass
    return False


def check_supported(events: list[FaultEvent], system: object) -> None:
    """Raise RuntimeError if ``system`` cannot take these faults (before the run starts)."""
    if not events:
        return
    if not isinstance(system, BatonCluster):
        raise RuntimeError(
            "faults need brokers the harness starts (--system baton without --brokers-at)"
        )
    kinds = {e.kind for e in events}
    if "kafka-restart" in kinds and system.requested_log != "kafka":
        raise RuntimeError("the kafka-restart fault needs --log kafka (a Kafka the harness starts)")
    if "diskfull" in kinds and not system.disk_limit_mb:
        raise RuntimeError("the diskfull fault needs --disk-limit MB (a size-limited data dir)")
    if "upgrade" in kinds and system.old_baton is None:
        raise RuntimeError("the upgrade fault needs --old-build (brokers started on an older build)")
    if kinds & NET_KINDS and system.net is None:
        raise RuntimeError("network faults need the cluster behind Toxiproxy (BatonCluster(net=True))")

