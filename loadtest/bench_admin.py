"""What the admin HTTP listener costs: confirmed-publish throughput with it on and
scraped every second, against off, in one run (docs/admin.md, docs/loadtest.md).

Each round starts a fresh broker (embedded file log), publishes ``--messages``
messages from ``--tasks`` tasks on one connection, one ``await conn.publish()`` at a
time (each waits for its confirm), and stops the broker. Rounds alternate between
"off" (no ``--admin-listen``) and "on" (``--admin-listen 127.0.0.1:0`` with a separate
scraper process fetching ``/metrics`` every ``--scrape-interval`` seconds, as Prometheus
would), so that drift on a shared machine hits both alike. Prints each round and the
median of each side, with the broker's CPU time per message (steadier than
throughput on a shared machine); the goal is "on" at most 5% below "off".

    python -m batonmq.loadtest.bench_admin --messages 150000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from batonmq import clients
from batonmq.broker.config import admin_ready_address, ready_address
from batonmq.loadtest.procstat import tree_usage


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


def _start(admin: bool) -> tuple[subprocess.Popen[bytes], str, str | None]:
    data_dir = tempfile.mkdtemp(prefix="baton-bench-admin-")
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


def _round(admin: bool, args: argparse.Namespace) -> dict[str, Any]:
    proc, address, admin_address = _start(admin)
    scraper = None
    try:
        if admin:
            assert admin_address is not None, "no admin line"
            scraper = subprocess.Popen(
                [sys.executable, "-m", "batonmq.loadtest.bench_admin", "--scrape",
                 f"http://{admin_address}/metrics", "--scrape-interval",
                 str(args.scrape_interval)],
                stdout=subprocess.PIPE, text=True,
            )
            assert scraper.stdout is not None
            # Publishing starts once the scraper has fetched the metrics once.
            if scraper.stdout.readline().strip() != "scraping":
                raise SystemExit("the scraper could not fetch the metrics")
        import uvloop

        cpu0 = tree_usage([proc.pid])[proc.pid][0]
        rate = uvloop.run(_publish(address, args.messages, args.tasks, args.size))
        cpu = tree_usage([proc.pid])[proc.pid][0] - cpu0
    finally:
        scrapes = 0
        if scraper is not None:
            scraper.send_signal(signal.SIGTERM)
            out, _ = scraper.communicate(timeout=30)
            scrapes = int(out.split()[-1]) if out.split() else 0
        _stop(proc)
    return {
        "admin": "on" if admin else "off",
        "publish_msgs_per_s": rate,
        "broker_cpu_us_per_msg": cpu / args.messages * 1e6,
        "scrapes": scrapes,
    }


def _scrape(url: str, interval: float) -> int:
    """Fetch ``url`` every ``interval`` s until SIGTERM; print how many answered."""
    done = 0
    stop = False

    def _term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    while not stop:
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                r.read()
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
    p.add_argument("--json", default=None, help="also write the result here")
    p.add_argument("--scrape", default=None, help=argparse.SUPPRESS)  # the scraper process
    args = p.parse_args()
    if args.scrape:
        return _scrape(args.scrape, args.scrape_interval)
    rounds = []
    for i in range(args.rounds * 2):
        r = _round(admin=i % 2 == 1, args=args)
        print(json.dumps(r), flush=True)
        rounds.append(r)
    off = statistics.median(r["publish_msgs_per_s"] for r in rounds if r["admin"] == "off")
    on = statistics.median(r["publish_msgs_per_s"] for r in rounds if r["admin"] == "on")
    cpu_off = statistics.median(r["broker_cpu_us_per_msg"] for r in rounds if r["admin"] == "off")
    cpu_on = statistics.median(r["broker_cpu_us_per_msg"] for r in rounds if r["admin"] == "on")
    result = {
        "messages": args.messages,
        "size": args.size,
        "tasks": args.tasks,
        "rounds": rounds,
        "off_median_msgs_per_s": off,
        "on_median_msgs_per_s": on,
        "on_vs_off_percent": (on / off - 1) * 100,
        "off_broker_cpu_us_per_msg": cpu_off,
        "on_broker_cpu_us_per_msg": cpu_on,
        "goal": "on at most 5% below off",
        "met": on >= off * 0.95,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
