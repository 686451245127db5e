"""What the admin HTTP listener costs: confirmed-publish throughput with it on and
scraped every second, against off, in one run (docs/admin.md, docs/loadtest.md).

Each round starts a fresh broker (embedded file log), publishes ``--messages``
messages from ``--tasks`` tasks on one connection, one ``await conn.publish()`` at a
time (each waits for its confirm), and stops the broker. Rounds alternate between
"off" (no ``--admin-listen``) and "on" (``--admin-listen 127.0.0.1:0`` with a separate
scraper process fetching ``/metrics`` every ``--scrape-interval`` seconds, as Prometheus
would), so that drift on a shared machine hits both alike; each cycle starts one side
later, so no side always runs first. Prints each round and the median of each side,
with the broker's CPU time per message (steadier than throughput on a shared machine),
and the load average over the run; the goal is "on" at most 5% below "off".

``--console`` adds a third side, "console": the listener on, scraped as in "on", and
a separate process polling what an open web console polls (``CONSOLE_ENDPOINTS``, all
at once every ``--console-interval`` s, as ``broker/console/console.js`` does), so the
run also shows what leaving a console page open costs. Rounds then go off, on,
console, on, console, off, console, off, on, ...

    python -m batonmq.loadtest.bench_admin --messages 150000 --rounds 3
    python -m batonmq.loadtest.bench_admin --messages 100000 --rounds 8 --console
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from batonmq import clients
from batonmq.broker.config import admin_ready_address, ready_address
from batonmq.loadtest.procstat import tree_usage

#: What the console's poll() fetches together, every POLL_MS (broker/console/console.js).
CONSOLE_ENDPOINTS = (
    "/api/overview", "/api/nodes", "/api/queues", "/api/connections", "/api/consumers",
    "/api/services", "/api/log",
)
#: The console's POLL_MS, in seconds.
CONSOLE_INTERVAL = 1.5


async def _publish(address: str, messages: int, tasks: int, size: int) -> float:
    """Confirmed publishes per second."""
    body = b"x" * size
    async with await clients.connect(address) as conn:
        await conn.declare_queue("bench")
        left = messages

        async def producer() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await conn.publish("bench", body)

        t0 = time.monotonic()
        await asyncio.gather(*(producer() for _ in range(tasks)))
        return messages / (time.monotonic() - t0)


def _start(admin: bool, data_dir: str) -> tuple[subprocess.Popen[bytes], str, str | None]:
    cmd = [sys.executable, "-m", "batonmq.broker", "--log-level", "WARNING", "serve",
           "--listen", "127.0.0.1:0", "--data-dir", data_dir]
    if admin:
        cmd += ["--admin-listen", "127.0.0.1:0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    admin_address = None
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        admin_address = admin_address or admin_ready_address(line)
        address = ready_address(line)
        if address is not None:
            return proc, address, admin_address
    proc.wait(10)
    raise SystemExit("the broker did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _poller(flag: str, target: str, interval: float) -> subprocess.Popen[str]:
    """Start a scraper (``--scrape``) or console (``--poll-console``) process and wait
    until it has fetched once, so publishing starts under its load."""
    poller = subprocess.Popen(
        [sys.executable, "-m", "batonmq.loadtest.bench_admin", flag, target,
         "--scrape-interval", str(interval)],
        stdout=subprocess.PIPE, text=True,
    )
    assert poller.stdout is not None
    if poller.stdout.readline().strip() != "scraping":
        poller.kill()
        raise SystemExit(f"the poller could not fetch {target}")
    return poller


def _ended(poller: subprocess.Popen[str] | None) -> int:
    """Stop a poller; how many polls it completed."""
    if poller is None:
        return 0
    poller.send_signal(signal.SIGTERM)
    out, _ = poller.communicate(timeout=30)
    return int(out.split()[-1]) if out.split() else 0


def _round(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    data_dir = tempfile.mkdtemp(prefix="baton-bench-admin-")
    proc, address, admin_address = _start(mode != "off", data_dir)
    scraper = console = None
    try:
        if mode != "off":
            assert admin_address is not None, "no admin line"
            scraper = _poller("--scrape", f"http://{admin_address}/metrics",
                              args.scrape_interval)
        if mode == "console":
            console = _poller("--poll-console", f"http://{admin_address}",
                              args.console_interval)
        import uvloop

        cpu0 = tree_usage([proc.pid])[proc.pid][0]
        rate = uvloop.run(_publish(address, args.messages, args.tasks, args.size))
        cpu = tree_usage([proc.pid])[proc.pid][0] - cpu0
    finally:
        scrapes, console_polls = _ended(scraper), _ended(console)
        _stop(proc)
        shutil.rmtree(data_dir, ignore_errors=True)  # ~100 MB of log per round
    return {
        "admin": mode,
        "publish_msgs_per_s": rate,
        "broker_cpu_us_per_msg": cpu / args.messages * 1e6,
        "scrapes": scrapes,
        "console_polls": console_polls,
    }


#: The admin listener asks for a login (docs/admin.md "Logging in"): the benchmark's
#: broker has the default guest, which logs in from loopback. A good HTTP Basic login
#: is checked once and then remembered, as a Prometheus scrape's is.
_GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()


def _fetch(url: str) -> None:
    request = urllib.request.Request(url, headers={"Authorization": _GUEST})
    with urllib.request.urlopen(request, timeout=5) as r:
        r.read()


def _scrape(urls: list[str], interval: float) -> int:
    """Fetch ``urls`` together every ``interval`` s until SIGTERM (one thread each, as a
    browser sends a page's requests at once); print how many rounds all answered."""
    done = 0
    stop = False

    def _term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    pool = ThreadPoolExecutor(max_workers=len(urls))
    while not stop:
        t0 = time.monotonic()
        try:
            list(pool.map(_fetch, urls))
            done += 1
            if done == 1:
                print("scraping", flush=True)
        except OSError:
            pass
        time.sleep(max(0.0, interval - (time.monotonic() - t0)))
    print(done, flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=150_000, help="per round")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--tasks", type=int, default=200, help="concurrent publishing tasks")
    p.add_argument("--rounds", type=int, default=3, help="rounds per side (off, on, off, ...)")
    p.add_argument("--scrape-interval", type=float, default=1.0)
    p.add_argument("--console", action="store_true",
                   help="add rounds with a console page's polling too (side 'console')")
    p.add_argument("--console-interval", type=float, default=CONSOLE_INTERVAL)
    p.add_argument("--json", default=None, help="also write the result here")
    p.add_argument("--scrape", default=None, help=argparse.SUPPRESS)  # the scraper process
    p.add_argument("--poll-console", default=None, help=argparse.SUPPRESS)  # the console's
    args = p.parse_args()
    if args.scrape:
        return _scrape([args.scrape], args.scrape_interval)
    if args.poll_console:
        return _scrape([args.poll_console + e for e in CONSOLE_ENDPOINTS], args.scrape_interval)
    sides = ["off", "on", "console"] if args.console else ["off", "on"]
    rounds = []
    load = [os.getloadavg()[0]]
    for i in range(args.rounds * len(sides)):
        # Each cycle starts one side later (off on console, on console off, ...): no side
        # always runs first, after the same neighbour.
        r = _round(sides[(i + i // len(sides)) % len(sides)], args)
        load.append(os.getloadavg()[0])
        print(json.dumps(r), flush=True)
        rounds.append(r)

    def median(side: str, field: str) -> float:
        return float(statistics.median(r[field] for r in rounds if r["admin"] == side))

    off, on = median("off", "publish_msgs_per_s"), median("on", "publish_msgs_per_s")
    result: dict[str, Any] = {
        "messages": args.messages,
        "size": args.size,
        "tasks": args.tasks,
        "rounds": rounds,
        "load_average_1min": {"min": min(load), "max": max(load),
                              "median": statistics.median(load)},
        "off_median_msgs_per_s": off,
        "on_median_msgs_per_s": on,
        "on_vs_off_percent": (on / off - 1) * 100,
        "off_broker_cpu_us_per_msg": median("off", "broker_cpu_us_per_msg"),
        "on_broker_cpu_us_per_msg": median("on", "broker_cpu_us_per_msg"),
        "goal": "on at most 5% below off",
        "met": on >= off * 0.95,
    }
    if args.console:
        console = median("console", "publish_msgs_per_s")
        result.update(
            console_median_msgs_per_s=console,
            console_vs_off_percent=(console / off - 1) * 100,
            console_broker_cpu_us_per_msg=median("console", "broker_cpu_us_per_msg"),
        )
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
