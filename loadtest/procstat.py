"""Broker CPU and RSS over time, read from ``/proc`` (Linux).

A :class:`Sampler` thread reads, once per interval, every server process of the system
under test *and its descendants* (RabbitMQ's ``beam.smp`` runs under a shell wrapper):
CPU time (``utime + stime`` of ``/proc/PID/stat``) and resident memory (``VmRSS`` of
``/proc/PID/status``). CPU is reported as cores used over the interval (1.0 = one core
busy), RSS in MiB.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Sampler", "tree_usage", "summarize", "GENERATOR_SATURATED"]

#: A load-generator process using this share of one core or more over the load phase
#: was (nearly) saturated: the figures of that run may measure the generator.
GENERATOR_SATURATED = 0.9

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    ppid = int(fields[1])
    cpu = (int(fields[11]) + int(fields[12])) / _TICK
    return ppid, cpu


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree_usage(roots: list[int]) -> dict[int, tuple[float, int]]:
    """CPU seconds and RSS bytes of each root process *including its descendants*.

    Returns:
        root pid -> (CPU seconds, RSS bytes); roots that are gone are left out.
    """
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        st = _stat(pid)
        if st is None:
            continue
        children.setdefault(st[0], []).append(pid)
        cpu[pid] = st[1]
    out: dict[int, tuple[float, int]] = {}
    for root in roots:
        if root not in cpu:
            continue
        total_cpu, total_rss = 0.0, 0
        stack = [root]
        while stack:
            pid = stack.pop()
            total_cpu += cpu.get(pid, 0.0)
            total_rss += _rss(pid)
            stack.extend(children.get(pid, ()))
        out[root] = (total_cpu, total_rss)
    return out


class Sampler(threading.Thread):
    """Samples the system's processes every ``interval`` seconds until stopped.

    Args:
        processes: called at each sample: ``label -> pid`` of the live server processes
            (a restarted broker has a new pid under the same label).
        t0: ``time.monotonic()`` the sample times count from.
        interval: seconds between samples.
    """

    def __init__(
        self, processes: Callable[[], dict[str, int]], t0: float, interval: float = 1.0
    ) -> None:
        super().__init__(name="proc-sampler", daemon=True)
        self.processes = processes
        self.t0 = t0
        self.interval = interval
        self.halt = threading.Event()
        #: ``{"t": s, "label": ..., "cpu": cores, "rss_mib": MiB}`` per process and sample.
        self.samples: list[dict[str, Any]] = []
        self._last: dict[str, tuple[int, float, float]] = {}  # label -> (pid, cpu s, at)
        self.latest_cpu = 0.0  # sum over processes of the last sample (progress line)
        self.latest_rss_mib = 0.0

    def sample(self) -> None:
        """Take one sample now."""
        procs = self.processes()
        now = time.monotonic()
        usage = tree_usage(list(procs.values()))
        cpu_sum = rss_sum = 0.0
        for label, pid in procs.items():
            got = usage.get(pid)
            if got is None:
                continue
            cpu_s, rss = got
            last = self._last.get(label)
            self._last[label] = (pid, cpu_s, now)
            if last is None or last[0] != pid or now <= last[2]:
                continue  # the first sample of a process only sets the base
            cores = max(0.0, (cpu_s - last[1]) / (now - last[2]))
            rss_mib = rss / (1 << 20)
            cpu_sum += cores
            rss_sum += rss_mib
            self.samples.append(
                {"t": round(now - self.t0, 3), "label": label, "cpu": round(cores, 4),
                 "rss_mib": round(rss_mib, 2)}
            )
        self.latest_cpu, self.latest_rss_mib = cpu_sum, rss_sum

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - /proc races: a process ended mid-read
                pass
            self.halt.wait(self.interval)

    def stop(self) -> None:
        """Stop sampling."""
        if self.is_alive():
            self.halt.set()
            self.join(5)


def summarize(
    rows: list[dict[str, Any]], load_end: float, skip_first: bool = False
) -> dict[str, dict[str, float]]:
    """Per process label: mean and max cores over the load phase, peak RSS over the run.

    Args:
        rows: samples (``t``, ``label``, ``cpu``, ``rss_mib``), ``t`` on one clock with
            ``load_end``.
        load_end: when the load phase ended (0: use every sample).
        skip_first: leave each process's first sample out of the CPU figures when it has
            three or more in the load phase (a worker's first second is its start-up:
            imports, connecting).
    """
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["label"], []).append(r)
    out: dict[str, dict[str, float]] = {}
    for label, rs in sorted(by.items()):
        load = [r for r in rs if not load_end or r["t"] <= load_end] or rs
        if skip_first and len(load) >= 3:
            load = load[1:]
        out[label] = {
            "cpu_mean": round(sum(r["cpu"] for r in load) / len(load), 3),
            "cpu_max": round(max(r["cpu"] for r in load), 3),
            "rss_max_mib": round(max(r["rss_mib"] for r in rs), 1),
        }
    return out
