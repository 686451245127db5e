"""The sealed log with real brokers (docs/log-sealing.md): what a broker without the
key sees and does, and a key rotation under a publishing load."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from batonmq import clients
from batonmq.broker.config import ready_address
from batonmq.cluster.codec import encode
from batonmq.cluster.errors import BatonError, QueueNotFound
from batonmq.cluster.events import Enqueue, Origin
from batonmq.cluster.log import open_log
from batonmq.cluster.log.sealed import KeyFile, SealedLog
from tests.helpers import drain, equal_digests, eventually, now, topology
from tests.integration.conftest import REPO, BrokerProcess

pytestmark = pytest.mark.integration


def key_entry(key_id: str, fill: bytes, extra: str = "") -> str:
    secret = base64.b64encode(fill * 32).decode()
    return f'[[key]]\nid = "{key_id}"\nsecret = "{secret}"\n{extra}'


def write(path: Path, text: str) -> None:
    """Replace the key file at once (a rename), with an mtime the brokers see as new."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def log_bytes(log_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(log_dir.iterdir()) if p.is_file())


def keyed_pair(tmp_path: Path, keys: Path, log_dir: Path) -> list[BrokerProcess]:
    return [
        BrokerProcess(tmp_path / f"node-{i}", log_url=f"file:{log_dir}", node_id=f"node-{i}",
                      extra=["--log-key-file", str(keys)])
        for i in (1, 2)
    ]


async def unopened(address: str) -> int:
    return int((await topology(address))["ignored"].get("unopened", 0))


@pytest.mark.parametrize("intruder_key", ["wrong", "none"])
async def test_a_broker_without_the_key_neither_reads_nor_injects(
    tmp_path: Path, intruder_key: str
) -> None:
    keys, wrong = tmp_path / "keys.toml", tmp_path / "wrong.toml"
    write(keys, key_entry("k1", b"a"))
    write(wrong, key_entry("k1", b"b"))
    log_dir = tmp_path / "shared-log"
    brokers = keyed_pair(tmp_path, keys, log_dir)
    intruder: subprocess.Popen[bytes] | None = None
    try:
        for b in brokers:
            b.start()
        body = f"sealed-body-{uuid.uuid4().hex}".encode()
        async with await clients.connect(brokers[0].address) as conn:
            await conn.declare_queue("orders")
            await conn.publish("orders", body)
        assert (await topology(brokers[0].address))["log_sealed"] is True
        # The log's bytes hold no body, and its files are the owner's only.
        raw = log_bytes(log_dir)
        assert raw and body not in raw and b"orders" not in raw
        assert all(p.stat().st_mode & 0o077 == 0 for p in log_dir.iterdir())
        for where in (log_dir, brokers[0].data_dir, brokers[0].data_dir / "store"):
            assert where.stat().st_mode & 0o077 == 0, f"{where} is open to others"
        # A broker with the wrong key, or none, on the same log: whatever it does with
        # its own records (it can read those), the keyed brokers apply none of them.
        out = tmp_path / "intruder.out"
        with open(out, "wb") as f:
            intruder = subprocess.Popen(
                [sys.executable, "-m", "batonmq.broker", "serve", "--listen", "127.0.0.1:0",
                 "--data-dir", str(tmp_path / "intruder"), "--log", f"file:{log_dir}",
                 "--node-id", "intruder",
                 *(["--log-key-file", str(wrong)] if intruder_key == "wrong" else [])],
                stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
            )
        before = await unopened(brokers[0].address)
        deadline = time.monotonic() + 20
        address = None
        while address is None and intruder.poll() is None and time.monotonic() < deadline:
            lines = out.read_text(errors="replace").splitlines()
            address = next(filter(None, map(ready_address, lines)), None)
            await asyncio.sleep(0.1)
        if address is not None:
            try:
                async with await clients.connect(address, timeout=5) as conn:
                    await asyncio.wait_for(conn.declare_queue("intruded"), 10)
                    await asyncio.wait_for(conn.publish("orders", b"forged"), 10)
            except (BatonError, TimeoutError, OSError):
                pass  # refused or never served: either way nothing reaches the others
        # And records written straight onto the log: with the wrong key, and plain.
        forged = encode(Origin("node-1", "x", 1 << 40, 0), Enqueue("orders", ((b"forged", {}),)))
        foreign = SealedLog(await open_log(f"file:{log_dir}"), KeyFile(str(wrong)))
        await foreign.append([forged])
        await foreign.inner.append([forged])
        await foreign.close()
        for b in brokers:
            await eventually(lambda: unopened(b.address), "the foreign records counted",
                             until=lambda n: n >= before + 2)
        # The keyed brokers keep serving, and apply nothing the intruder wrote.
        async with await clients.connect(brokers[1].address) as conn:
            await conn.publish("orders", b"after")
            with pytest.raises(QueueNotFound):
                await conn.queue_stats("intruded")
        await equal_digests(brokers)
        got = await drain(brokers[0].address, "orders", count=2)
        assert sorted(m.body for m in got) == sorted([body, b"after"])
        assert b"forged" not in [m.body for m in got]
    finally:
        if intruder is not None and intruder.poll() is None:
            intruder.terminate()
            intruder.wait(15)
        for b in brokers:
            b.stop()


async def test_rotation_under_load_loses_no_confirmed_message(tmp_path: Path) -> None:
    """Add a key while publishes run (it seals at once: the other broker finds it on
    the first record it cannot open), retire the old one once the log has gone past
    it, publish again: every confirmed message is there, none ignored."""
    keys = tmp_path / "keys.toml"
    write(keys, key_entry("k1", b"a"))
    log_dir = tmp_path / "shared-log"
    brokers = keyed_pair(tmp_path, keys, log_dir)
    confirmed: list[bytes] = []
    try:
        for b in brokers:
            b.start()
        async with await clients.connect(brokers[0].address) as conn:
            await conn.declare_queue("load")

        async def producer(k: int, count: int, tag: str) -> None:
            async with await clients.connect(brokers[k % 2].address) as conn:
                for i in range(count):
                    body = f"{tag}-{k}-{i}".encode()
                    await conn.publish("load", body)
                    confirmed.append(body)

        load = asyncio.gather(*(producer(k, 400, "a") for k in range(4)))
        await eventually(lambda: now(len(confirmed)), "publishes under way", timeout=60,
                         until=lambda n: n >= 300, interval=0.01)
        write(keys, key_entry("k1", b"a") + key_entry("k2", b"b"))
        await asyncio.wait_for(load, 120)
        assert b"\xc1S\x01\x02k2" in log_bytes(log_dir), "no record sealed with the new key"
        await equal_digests(brokers)
        # Retire k1 (the brokers have applied past every record it sealed).
        write(keys, key_entry("k1", b"a", f"not_after = {time.time():.0f}\n")
              + key_entry("k2", b"b"))
        await asyncio.sleep(1.5)  # a poll
        await asyncio.wait_for(asyncio.gather(*(producer(k, 100, "b") for k in range(2))), 60)
        got = await drain(brokers[1].address, "load", count=len(confirmed), timeout=60)
        bodies = [m.body for m in got]
        assert sorted(bodies) == sorted(confirmed), "a confirmed message is missing or doubled"
        for b in brokers:
            assert await unopened(b.address) == 0
    finally:
        for b in brokers:
            b.stop()


async def test_records_of_many_unknown_key_ids_do_not_flood_the_broker(tmp_path: Path) -> None:
    """Records naming 3,000 distinct key ids the broker does not have: it skips them
    without reading its key file again (the file did not change) and without a log
    line per record (docs/log-sealing.md)."""
    keys, wrong = tmp_path / "keys.toml", tmp_path / "wrong.toml"
    write(keys, key_entry("k1", b"a"))
    write(wrong, key_entry("k1", b"b"))
    log_dir = tmp_path / "log"
    b = BrokerProcess(tmp_path / "b", log_url=f"file:{log_dir}",
                      extra=["--log-key-file", str(keys)])
    b.start()
    try:
        before = await unopened(b.address)
        foreign = SealedLog(await open_log(f"file:{log_dir}"), KeyFile(str(wrong)))
        record = foreign.seal([b"forged"])[0]
        assert record[3] == 2 and record[4:6] == b"k1"
        forged = [b"\xc1S\x01\x05" + f"x{i:04x}".encode() + record[6:] for i in range(3000)]
        for i in range(0, len(forged), 500):
            await foreign.inner.append(forged[i:i + 500])
        await foreign.close()
        await eventually(lambda: unopened(b.address), "the foreign records skipped",
                         until=lambda n: n >= before + 3000, timeout=30)
        out = b.output_since(b"== test: start 1")
        reads = [line for line in out.splitlines() if "read: keys" in line]
        assert len(reads) <= 1, reads[:5]
        async with await clients.connect(b.address) as conn:  # still serving
            await conn.declare_queue("q")
    finally:
        b.stop()
