"""Throughput benchmark of the per-message paths on one broker (embedded file log).

Phase 1: ``--tasks`` tasks share one connection, each doing ``await conn.publish()``
for one message at a time (confirms), until ``--messages`` are confirmed.
Phase 2: ``--consumers`` consumers (one connection each) with ``--prefetch`` do
``async for msg in consumer: await msg.ack()`` until the queue is drained.
Prints msgs/s and the confirm latency percentiles of phase 1.

``--tls``: the same phases twice in one run, against a plaintext broker and against
a TLS one (a throw-away CA, loadtest/certs.py), and both results side by side.

    python -m batonmq.loadtest.bench_throughput --messages 100000 --size 1024 [--tls]
    python -m batonmq.loadtest.bench_throughput --sealed --rounds 2   # plain vs sealed log
    python -m batonmq.loadtest.bench_throughput --secure --rounds 2   # all off vs all on

``--secure``: alternated rounds against a broker with every protection off (plaintext,
the guest user, a plain log) and one with all on (TLS, a user that is not an admin and
has rights over the bench queue only, a sealed log), in this one run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from batonmq import clients
from batonmq.broker.config import ready_address
from batonmq.loadtest.hist import exact_percentile


async def _run(
    address: str,
    args: argparse.Namespace,
    tls: ssl.SSLContext | None = None,
    login: dict[str, str] | None = None,
) -> dict[str, float]:
    body = b"x" * args.size
    latencies: list[float] = []
    login = login or {}
    if "admin_password" in login:  # all on: the admin makes the bench user first
        async with await clients.connect(address, ssl=tls, username="admin",
                                         password=login["admin_password"]) as admin:
            await admin.put_user("bench", "bench-password")
            await admin.set_permissions("bench", configure="bench", write="bench", read="bench")
        login = {"username": "bench", "password": "bench-password"}
    user, password = login.get("username"), login.get("password")
    async with await clients.connect(address, ssl=tls, username=user, password=password) as conn:
        await conn.declare_queue("bench")
        await conn.purge_queue("bench")
        left = args.messages

        async def producer() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                await conn.publish("bench", body)
                latencies.append(time.perf_counter() - t0)

        t0 = time.monotonic()
        await asyncio.gather(*(producer() for _ in range(args.tasks)))
        pub_s = time.monotonic() - t0

    got = 0

    async def consumer() -> None:
        nonlocal got
        async with await clients.connect(address, ssl=tls, username=user,
                                         password=password) as c:
            async with c.consume("bench", prefetch=args.prefetch) as cons:
                while got < args.messages:
                    msg = await cons.get(timeout=2)
                    if msg is None:
                        return
                    await msg.ack()
                    got += 1

    t0 = time.monotonic()
    await asyncio.gather(*(consumer() for _ in range(args.consumers)))
    con_s = time.monotonic() - t0
    latencies.sort()
    return {
        "messages": args.messages,
        "size": args.size,
        "publish_msgs_per_s": args.messages / pub_s,
        "confirm_p50_ms": exact_percentile(latencies, 0.5) * 1000,
        "confirm_p99_ms": exact_percentile(latencies, 0.99) * 1000,
        "consumed": got,
        "consume_ack_msgs_per_s": got / con_s,
    }


def _bench(
    args: argparse.Namespace,
    flags: list[str],
    tls: ssl.SSLContext | None = None,
    login: dict[str, str] | None = None,
) -> dict[str, float]:
    """Start a broker (with ``flags``), run both phases against it, stop it."""
    data_dir = tempfile.mkdtemp(prefix="baton-bench-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "batonmq.broker", "--log-level", "WARNING", "serve",
         "--listen", "127.0.0.1:0", "--data-dir", data_dir, *flags],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        address = None
        for raw in proc.stdout:
            address = ready_address(raw.decode(errors="replace"))
            if address is not None:
                break
        if address is None:
            raise SystemExit("broker did not start")
        import uvloop

        return uvloop.run(_run(address, args, tls, login))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _sealed_flags() -> list[str]:
    """``--log-key-file`` with a fresh key (docs/log-sealing.md)."""
    fd, path = tempfile.mkstemp(prefix="baton-bench-keys-", suffix=".toml")
    secret = base64.b64encode(os.urandom(32)).decode()
    with os.fdopen(fd, "w") as f:
        f.write(f'[[key]]\nid = "bench"\nsecret = "{secret}"\n')
    return ["--log-key-file", path]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--tasks", type=int, default=200, help="concurrent publishing tasks")
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--json", default=None)
    p.add_argument("--tls", action="store_true",
                   help="run against a plaintext broker and a TLS one, and compare")
    p.add_argument("--sealed", action="store_true",
                   help="measure a plain and a sealed log (--log-key-file) in turn, --rounds"
                        " times each, in this one run")
    p.add_argument("--secure", action="store_true",
                   help="measure all protections off and all on (TLS, a user with rights, a"
                        " sealed log) in turn, --rounds times each, in this one run")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds of each kind (--sealed, --secure)")
    args = p.parse_args()
    result: dict[str, Any]
    if args.sealed:
        runs: dict[str, list[dict[str, float]]] = {"plain": [], "sealed": []}
        for _ in range(args.rounds):  # alternated, so a drift in the machine hits both
            runs["plain"].append(_bench(args, []))
            runs["sealed"].append(_bench(args, _sealed_flags()))
        result = {"runs": runs}
        for kind in ("plain", "sealed"):
            for metric in ("publish_msgs_per_s", "consume_ack_msgs_per_s", "confirm_p50_ms"):
                result[f"{kind}_{metric}_median"] = statistics.median(r[metric] for r in runs[kind])
        result["sealed_vs_plain_publish"] = (
            result["sealed_publish_msgs_per_s_median"] / result["plain_publish_msgs_per_s_median"]
        )
        ok = all(r["consumed"] == args.messages for rs in runs.values() for r in rs)
    elif args.secure:
        from batonmq.loadtest.certs import make_certs

        certs = make_certs(Path(tempfile.mkdtemp(prefix="baton-bench-certs-")))
        tls = clients.tls.client_context(str(certs.ca))
        secured: dict[str, list[dict[str, float]]] = {"all_off": [], "all_on": []}
        for _ in range(args.rounds):  # alternated, so a drift in the machine hits both
            secured["all_off"].append(_bench(args, []))
            fd, password_file = tempfile.mkstemp(prefix="baton-bench-admin-")
            with os.fdopen(fd, "w") as f:
                f.write("bench-admin-password\n")
            flags = ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key),
                     "--admin-password-file", password_file, *_sealed_flags()]
            secured["all_on"].append(
                _bench(args, flags, tls, {"admin_password": "bench-admin-password"})
            )
        result = {"runs": secured}
        for kind in ("all_off", "all_on"):
            for metric in ("publish_msgs_per_s", "consume_ack_msgs_per_s", "confirm_p50_ms"):
                result[f"{kind}_{metric}_median"] = statistics.median(
                    r[metric] for r in secured[kind]
                )
        result["all_on_vs_off_publish"] = (
            result["all_on_publish_msgs_per_s_median"] / result["all_off_publish_msgs_per_s_median"]
        )
        ok = all(r["consumed"] == args.messages for rs in secured.values() for r in rs)
    elif args.tls:
        from batonmq.loadtest.certs import make_certs

        certs = make_certs(Path(tempfile.mkdtemp(prefix="baton-bench-certs-")))
        flags = ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
        tls = clients.tls.client_context(str(certs.ca))
        result = {"plaintext": _bench(args, []), "tls": _bench(args, flags, tls)}
        result["tls_publish_ratio"] = (
            result["tls"]["publish_msgs_per_s"] / result["plaintext"]["publish_msgs_per_s"]
        )
        ok = all(result[k]["consumed"] == args.messages for k in ("plaintext", "tls"))
    else:
        result = _bench(args, [])
        ok = result["consumed"] == args.messages
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
