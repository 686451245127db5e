"""The import-entries pipeline (docs/design.md §11, docs/spark.md): a generator of realistic
import entries, their validation, and the Spark job that streams a queue of them into
a table exactly once, run by whichever of several instances leads the service.

An import entry is one JSON document per message::

    {"type": "order", "key": "order-7f3a-00000042", "version": 1,
     "occurred_at": "2025-05-01T12:00:00+00:00",
     "payload": {"customer": "customer-7f3a-00000007", "amount": 12.5,
                 "currency": "EUR", "lines": [{"sku": "A-1", "qty": 2}]}}

:func:`validate` turns a body into a table row or a reason; the job
(:func:`start_query`) writes valid rows to a Parquet (or Delta) table and publishes
invalid entries to a dead-letter queue with the reason in ``x-import-error``. The
dead-letter publish carries the idempotency key ``import-dlq:<queue>:<position>``, so a
micro-batch that Spark runs again (after a crash) does not publish it twice.

Only the generator and the validation are pure Python; the Spark parts import
pyspark when called.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import random
import re
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from batonmq.clients import client as _aio
from batonmq.cluster.errors import BatonError, QueueNotFound

if TYPE_CHECKING:
    import pyarrow as pa

    from batonmq.clients.leadership import Term
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "ENTRY_TYPES",
    "TABLE_SCHEMA",
    "Row",
    "validate",
    "generate",
    "publish_entries",
    "spark_session",
    "start_query",
    "PipelineConfig",
    "run_pipeline",
]

log = logging.getLogger("baton.import_entries")

ENTRY_TYPES: Final = ("customer", "order", "payment", "shipment")
#: The table's columns (Spark DDL).
TABLE_SCHEMA: Final = (
    "position LONG, key STRING, type STRING, version INT, occurred_at TIMESTAMP,"
    " amount DOUBLE, currency STRING, payload STRING, published_at TIMESTAMP"
)
_CURRENCY = re.compile(r"^[A-Z]{3}$")
_COUNTRY = re.compile(r"^[A-Z]{2}$")
_METHODS: Final = ("card", "transfer", "wallet")


@dataclass(frozen=True, slots=True)
class Row:
    """A valid entry, as the table stores it (without position and publish time)."""

    key: str
    type: str
    version: int
    occurred_at: datetime.datetime
    amount: float | None
    currency: str | None
    payload: str  # the payload object as compact JSON


class _Invalid(Exception):
    pass


def _need(cond: bool, why: str) -> None:
    if not cond:
        raise _Invalid(why)


def _text(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not (isinstance(value, str) and 0 < len(value) <= 200):
        raise _Invalid(f"payload.{name} must be a string")
    return value


def _amount(obj: dict[str, Any], positive: bool) -> float:
    value = obj.get("amount")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _Invalid("payload.amount must be a number")
    _need(value > 0 if positive else value >= 0, f"payload.amount {value} out of range")
    return float(value)


def _currency(obj: dict[str, Any]) -> str:
    value = obj.get("currency")
    if not (isinstance(value, str) and _CURRENCY.match(value)):
        raise _Invalid("payload.currency must be ISO 4217")
    return value


def validate(body: bytes) -> tuple[Row | None, str | None]:
    """Parse and check one entry.

    Returns:
        ``(row, None)`` for a valid entry, ``(None, reason)`` for an invalid one.
    """
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"not JSON: {exc}"
    try:
        _need(isinstance(doc, dict), "not a JSON object")
        kind = doc.get("type")
        _need(kind in ENTRY_TYPES, f"unknown type {kind!r}")
        key = doc.get("key")
        _need(isinstance(key, str) and 0 < len(key) <= 128, "missing or bad key")
        version = doc.get("version")
        _need(type(version) is int and version >= 1, "version must be a positive int")
        when = doc.get("occurred_at")
        _need(isinstance(when, str), "occurred_at must be an ISO 8601 string")
        try:
            occurred = datetime.datetime.fromisoformat(when)
        except ValueError:
            raise _Invalid(f"occurred_at {when!r} is not ISO 8601") from None
        if occurred.tzinfo is None:
            occurred = occurred.replace(tzinfo=datetime.timezone.utc)
        payload = doc.get("payload")
        _need(isinstance(payload, dict), "payload must be an object")
        amount: float | None = None
        currency: str | None = None
        if kind == "customer":
            _text(payload, "name")
            _need("@" in _text(payload, "email"), "payload.email is not an address")
            _need(bool(_COUNTRY.match(_text(payload, "country"))), "payload.country must be ISO 3166")
        elif kind == "order":
            _text(payload, "customer")
            amount, currency = _amount(payload, False), _currency(payload)
            lines = payload.get("lines")
            _need(isinstance(lines, list) and len(lines) > 0, "payload.lines must be a non-empty list")
        elif kind == "payment":
            _text(payload, "order")
            amount, currency = _amount(payload, True), _currency(payload)
            _need(payload.get("method") in _METHODS, "payload.method unknown")
        else:
            _text(payload, "order")
            _text(payload, "carrier")
            _text(payload, "tracking")
    except _Invalid as exc:
        return None, str(exc)
    return (
        Row(
            key=key,
            type=kind,
            version=version,
            occurred_at=occurred,
            amount=amount,
            currency=currency,
            payload=json.dumps(payload, separators=(",", ":"), sort_keys=True),
        ),
        None,
    )


# --- the generator ----------------------------------------------------------------------

_INVALID_KINDS: Final = (
    "not-json", "unknown-type", "missing-key", "negative-amount", "bad-currency", "bad-date",
)


def generate(
    count: int, *, run: str | None = None, invalid_ratio: float = 0.01, seed: int | None = None
) -> Iterator[tuple[bytes, bool]]:
    """Yield ``count`` realistic import entries as ``(body, valid)``.

    Keys are unique: ``<type>-<run>-<n>`` (``run`` defaults to a random id). About
    ``invalid_ratio`` of them are invalid on purpose (broken JSON, an unknown type, a
    missing key, a negative amount, a bad currency, a bad date), each kind in turn.
    """
    rng = random.Random(seed)
    run = run or secrets.token_hex(3)
    base = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)
    bad = 0
    for n in range(count):
        kind = ENTRY_TYPES[rng.randrange(len(ENTRY_TYPES))]
        key = f"{kind}-{run}-{n:08d}"
        occurred = (base + datetime.timedelta(seconds=rng.randrange(90 * 86400))).isoformat()
        ref = f"{'customer' if kind == 'order' else 'order'}-{run}-{rng.randrange(max(1, n + 1)):08d}"
        payload: dict[str, Any]
        if kind == "customer":
            payload = {
                "name": f"Customer {n}",
                "email": f"c{n}@example.com",
                "country": rng.choice(("DE", "FR", "NL", "US", "GB", "JP")),
            }
        elif kind == "order":
            payload = {
                "customer": ref,
                "amount": round(rng.uniform(1, 900), 2),
                "currency": rng.choice(("EUR", "USD", "GBP")),
                "lines": [
                    {"sku": f"SKU-{rng.randrange(1000):04d}", "qty": rng.randrange(1, 5)}
                    for _ in range(rng.randrange(1, 4))
                ],
            }
        elif kind == "payment":
            payload = {
                "order": ref,
                "amount": round(rng.uniform(1, 900), 2),
                "currency": rng.choice(("EUR", "USD", "GBP")),
                "method": rng.choice(_METHODS),
            }
        else:
            payload = {
                "order": ref,
                "carrier": rng.choice(("DHL", "UPS", "PostNL")),
                "tracking": secrets.token_hex(6),
            }
        doc: dict[str, Any] = {
            "type": kind, "key": key, "version": 1, "occurred_at": occurred, "payload": payload,
        }
        valid = True
        if invalid_ratio > 0 and (n + 1) * invalid_ratio >= bad + 1:
            valid = False
            how = _INVALID_KINDS[bad % len(_INVALID_KINDS)]
            bad += 1
            if how == "not-json":
                yield (json.dumps(doc)[:-7].encode(), False)
                continue
            if how == "unknown-type":
                doc["type"] = "refund"
            elif how == "missing-key":
                del doc["key"]
            elif how == "negative-amount":
                doc["type"], doc["payload"] = "payment", {
                    "order": ref, "amount": -5.0, "currency": "EUR", "method": "card",
                }
            elif how == "bad-currency":
                doc["type"], doc["payload"] = "payment", {
                    "order": ref, "amount": 5.0, "currency": "euro", "method": "card",
                }
            else:
                doc["occurred_at"] = "yesterday"
        yield (json.dumps(doc, separators=(",", ":")).encode(), valid)


async def publish_entries(
    brokers: str,
    queue: str,
    count: int,
    *,
    batch: int = 500,
    rate: float | None = None,
    invalid_ratio: float = 0.01,
    run: str | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """Publish ``count`` generated entries to ``queue`` (declared if missing), in
    batches of ``batch``, at most ``rate`` entries/s.

    Every batch carries an idempotency key, and the connection fails over across
    ``brokers`` re-sending unconfirmed batches: each entry is on the queue once.

    Returns:
        ``{"published", "valid", "invalid", "seconds", "run"}``.
    """
    run = run or secrets.token_hex(3)
    async with await _aio.connect(brokers, failover=True, failover_timeout=60) as conn:
        await _declare(conn, queue)
        start = time.monotonic()
        valid = invalid = 0
        chunk: list[tuple[bytes, dict[str, Any]]] = []
        pending: list[asyncio.Task[list[int]]] = []
        for body, ok in generate(count, run=run, invalid_ratio=invalid_ratio, seed=seed):
            valid += ok
            invalid += not ok
            chunk.append((body, {"content-type": "application/json"}))
            if len(chunk) >= batch:
                pending.append(asyncio.ensure_future(conn.publish_batch(queue, chunk)))
                chunk = []
                if len(pending) >= 8:  # a few batches in flight
                    await pending.pop(0)
                if rate:
                    ahead = (valid + invalid) / rate - (time.monotonic() - start)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
        if chunk:
            pending.append(asyncio.ensure_future(conn.publish_batch(queue, chunk)))
        for task in pending:
            await task
        return {
            "published": valid + invalid,
            "valid": valid,
            "invalid": invalid,
            "seconds": round(time.monotonic() - start, 3),
            "run": run,
        }


async def _declare(conn: _aio.Connection, queue: str) -> None:
    """Declare ``queue`` with default settings unless it exists (with any settings)."""
    try:
        await conn.queue_stats(queue)
    except QueueNotFound:
        await conn.declare_queue(queue)


# --- the Spark job ----------------------------------------------------------------------


def spark_session(
    app: str = "baton-import-entries", master: str = "local[2]", *, detach: bool = False
) -> "SparkSession":
    """A SparkSession whose Python workers use this interpreter (where Baton is
    installed), with the ``baton`` format registered.

    ``detach`` starts Spark's JVM in a session of its own, so a Ctrl-C at the terminal
    (SIGINT to the whole foreground process group) reaches only this process, which
    stops in order. Without it, the signal also reaches Spark's Python workers, which
    die in the middle of the batch in progress with a long Java stack trace. The JVM
    still ends with this process: it exits when its stdin, a pipe from here, closes.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from batonmq.clients import spark as baton_spark

    if detach:
        from pyspark import SparkConf, SparkContext
        from pyspark.java_gateway import launch_gateway

        # (Only where no Spark runs in this process yet: the pipeline's own command.)
        conf = SparkConf().setAppName(app).setMaster(master)
        detached = {"start_new_session": True}
        gateway = launch_gateway(conf, popen_kwargs=detached)  # type: ignore[no-untyped-call]
        SparkContext(conf=conf, gateway=gateway)  # the builder below takes it up
    builder: Any = SparkSession.builder
    spark: SparkSession = (
        builder.appName(app)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    baton_spark.register(spark)
    return spark


def _arrow_schema() -> "pa.Schema":
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            ("position", pa.int64()), ("key", pa.string()), ("type", pa.string()),
            ("version", pa.int32()), ("occurred_at", ts), ("amount", pa.float64()),
            ("currency", pa.string()), ("payload", pa.string()), ("published_at", ts),
        ]
    )


class _Route:
    """The mapInArrow function: valid rows out, invalid entries to the dead-letter
    queue. Picklable (it holds strings only); runs in Spark's Python workers."""

    def __init__(self, brokers: str, queue: str, dlq: str) -> None:
        self.brokers, self.queue, self.dlq = brokers, queue, dlq

    def __call__(self, batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        import pyarrow as pa

        schema = _arrow_schema()
        for batch in batches:
            cols = batch.to_pydict()
            out: dict[str, list[Any]] = {name: [] for name in schema.names}
            bad: list[tuple[int, bytes, str]] = []
            for pos, body, published in zip(cols["position"], cols["body"], cols["publish_time"]):
                row, why = validate(body)
                if row is None:
                    bad.append((pos, body, why or "invalid"))
                    continue
                out["position"].append(pos)
                out["key"].append(row.key)
                out["type"].append(row.type)
                out["version"].append(row.version)
                out["occurred_at"].append(row.occurred_at)
                out["amount"].append(row.amount)
                out["currency"].append(row.currency)
                out["payload"].append(row.payload)
                out["published_at"].append(published)
            if bad:
                # Before the batch's rows reach the sink: a replay publishes again,
                # with the same keys, and the broker enqueues each once.
                asyncio.run(self._dead_letter(bad))
            yield pa.RecordBatch.from_pydict(out, schema=schema)

    async def _dead_letter(self, bad: list[tuple[int, bytes, str]]) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                async with await _aio.connect(
                    self.brokers, failover=True, failover_timeout=30
                ) as conn:
                    await asyncio.gather(
                        *(
                            conn.publish(
                                self.dlq,
                                body,
                                {
                                    "x-import-error": why[:500],
                                    "x-source-queue": self.queue,
                                    "x-source-position": pos,
                                },
                                idempotency_key=f"import-dlq:{self.queue}:{pos}",
                            )
                            for pos, body, why in bad
                        )
                    )
                return
            except BatonError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
                log.warning("dead-letter publish failed, retrying: %s", exc)
                await asyncio.sleep(0.5)


def start_query(
    spark: "SparkSession",
    *,
    brokers: str,
    queue: str,
    table: str,
    checkpoint: str,
    dlq: str | None = None,
    trigger_seconds: float = 1.0,
    max_per_trigger: int = 100_000,
    fmt: str = "parquet",
    fence: tuple[str, int] | None = None,
) -> "StreamingQuery":
    """Start the streaming query: ``queue`` -> validate -> ``table`` (exactly once with
    ``checkpoint``); invalid entries -> ``dlq`` (default ``<queue>.dlq``). ``fence``:
    the leadership term (service, token) that fences the source's commits."""
    dlq = dlq or f"{queue}.dlq"
    reader = (
        spark.readStream.format("baton")
        .option("brokers", brokers)
        .option("queue", queue)
        .option("maxEntriesPerTrigger", str(max_per_trigger))
    )
    if fence is not None:
        # docs/spark.md "Fencing": a driver paused while a standby took over cannot
        # commit late; its Reserve and AcceptThrough carry this term's token.
        reader = reader.option("service", fence[0]).option("token", str(fence[1]))
    source = reader.load()
    rows = source.mapInArrow(_Route(brokers, queue, dlq), TABLE_SCHEMA)
    return (
        rows.writeStream.format(fmt)
        .queryName(f"import-entries-{queue}")
        .option("path", table)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{trigger_seconds} seconds")
        .start()
    )


@dataclass
class PipelineConfig:
    """Settings of one pipeline instance (``baton import-entries run``)."""

    brokers: str
    queue: str
    table: str
    checkpoint: str
    dlq: str | None = None
    service: str = "import-entries"
    leadership: bool = True
    trigger_seconds: float = 1.0
    max_per_trigger: int = 100_000
    fmt: str = "parquet"
    master: str = "local[2]"
    stop_when_idle: float | None = None  # stop after this many idle seconds (tests, demos)


async def run_pipeline(cfg: PipelineConfig, stop: asyncio.Event | None = None) -> int:
    """Run one pipeline instance until ``stop`` is set (or it idles, if configured).

    With ``leadership``, the instance runs for the service's leadership and runs the
    query only while it leads; when it loses the term (its broker is lost, its session
    dropped, a handover is asked), it stops the query at once and runs again. The
    Spark session starts before (a warm standby takes over in seconds).
    """
    stop = stop or asyncio.Event()
    spark = await asyncio.to_thread(spark_session, master=cfg.master, detach=True)
    async with await _aio.connect(cfg.brokers, failover=True, failover_timeout=60) as conn:
        await _declare(conn, cfg.queue)
        await _declare(conn, cfg.dlq or f"{cfg.queue}.dlq")
    print(f"baton import-entries: ready (pid {os.getpid()})", flush=True)
    while not stop.is_set():
        running = asyncio.Event()  # set while a query runs (it handles stop itself)
        if cfg.leadership:
            task = asyncio.ensure_future(_lead_and_run(cfg, spark, stop, running))
        else:
            task = asyncio.ensure_future(_run_query(cfg, spark, stop, None, running))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not task.done() and not running.is_set():
            task.cancel()  # stopped while waiting to lead: give up the candidacy
        try:
            done = await task
        except asyncio.CancelledError:
            break
        except BatonError as exc:
            log.warning("pipeline: %s; trying again", exc)
            print(f"baton import-entries: {exc.message}; trying again", flush=True)
            await asyncio.sleep(1.0)
            continue
        if done:
            break
    await asyncio.to_thread(spark.stop)
    return 0


async def _lead_and_run(
    cfg: PipelineConfig, spark: "SparkSession", stop: asyncio.Event, running: asyncio.Event
) -> bool:
    conn = await _aio.connect(cfg.brokers, failover=False, timeout=10)
    try:
        # Leaving the block resigns; a lost connection ends the term (term.lost).
        async with conn.lead(cfg.service) as term:
            print(f"baton import-entries: leading {cfg.service!r}, token {term.token}", flush=True)
            return await _run_query(cfg, spark, stop, term, running)
    finally:
        await conn.close()


async def _run_query(
    cfg: PipelineConfig,
    spark: "SparkSession",
    stop: asyncio.Event,
    term: "Term | None",
    running: asyncio.Event,
) -> bool:
    """Run the query until stopped, idle, failed or the term is lost. Returns True
    when the pipeline should end (stopped or idle)."""
    running.set()
    query = await asyncio.to_thread(
        start_query,
        spark,
        brokers=cfg.brokers,
        queue=cfg.queue,
        table=cfg.table,
        checkpoint=cfg.checkpoint,
        dlq=cfg.dlq,
        trigger_seconds=cfg.trigger_seconds,
        max_per_trigger=cfg.max_per_trigger,
        fmt=cfg.fmt,
        fence=None if term is None else (term.service, term.token),
    )
    print(f"baton import-entries: query {query.id} running", flush=True)
    idle_since: float | None = None  # from the first finished micro-batch on
    last_batch = -1
    flushed_at = time.monotonic()
    try:
        while True:
            if time.monotonic() - flushed_at > 2.0:
                flushed_at = time.monotonic()
                await _accept_committed(cfg, term)
            if stop.is_set():
                return True
            if term is not None and (term.lost.is_set() or term.handover_requested.is_set()):
                why = "lost" if term.lost.is_set() else "handed over"
                print(f"baton import-entries: leadership {why}: stopping the query", flush=True)
                return False
            if not query.isActive:
                exc = query.exception()
                raise BatonError(f"the streaming query ended: {exc}")
            if cfg.stop_when_idle is not None:
                progress = query.lastProgress
                if progress and progress["batchId"] != last_batch:
                    last_batch = progress["batchId"]
                    if int(progress["numInputRows"]) > 0 or idle_since is None:
                        idle_since = time.monotonic()
                if idle_since is not None and time.monotonic() - idle_since > cfg.stop_when_idle:
                    print("baton import-entries: idle, stopping", flush=True)
                    return True
            waiters = [asyncio.ensure_future(stop.wait())]
            if term is not None:
                waiters.append(asyncio.ensure_future(term.lost.wait()))
            _, pending = await asyncio.wait(waiters, timeout=0.25)
            for w in pending:
                w.cancel()
    finally:
        if term is None or not (term.lost.is_set() or term.handover_requested.is_set()):
            # An orderly stop (a signal, idle) lets the micro-batch in progress finish:
            # stopping in the middle of one interrupts its writer, which Spark reports
            # with an ERROR and a long Java stack trace. A lost term stops at once.
            await asyncio.to_thread(_wait_between_batches, query, STOP_PATIENCE_S)
        await asyncio.to_thread(query.stop)
        print("baton import-entries: query stopped", flush=True)
        if term is None or not term.lost.is_set():
            await _accept_committed(cfg, term)


#: Seconds an orderly stop waits for the micro-batch in progress to finish.
STOP_PATIENCE_S = 30.0


def _wait_between_batches(query: "StreamingQuery", patience: float) -> None:
    """Return once ``query`` runs no micro-batch (or after ``patience`` seconds)."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline and query.isActive:
        if not query.status.get("isTriggerActive", False):
            return
        time.sleep(0.05)


def committed_position(checkpoint: str) -> int | None:
    """The source position below which the sink has committed everything, read from a
    local checkpoint: the offset of the last batch in ``commits/``.

    Spark tells the source about a committed batch only when it plans the next one
    (never, while the queue is idle); the pipeline reads the checkpoint instead, so
    the queue drains as soon as the table has the entries.
    """
    path = checkpoint[len("file:"):] if checkpoint.startswith("file:") else checkpoint
    try:
        batches = [int(n) for n in os.listdir(os.path.join(path, "commits")) if n.isdigit()]
    except FileNotFoundError:
        return None
    if not batches:
        return None
    try:
        with open(os.path.join(path, "offsets", str(max(batches))), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    # "v1", the batch's metadata, then one offset per source (ours is the only one).
    try:
        offset = json.loads(lines[2])
    except (IndexError, ValueError):
        return None
    position = offset.get("position") if isinstance(offset, dict) else None
    return position if isinstance(position, int) else None


async def _accept_committed(cfg: PipelineConfig, term: "Term | None") -> None:
    """AcceptThrough the checkpoint's committed position (see committed_position),
    fenced by ``term`` when the instance leads (a stale term's commit is refused)."""
    position = committed_position(cfg.checkpoint)
    if position is None:
        return
    service, token = ("", -1) if term is None else (term.service, term.token)
    try:
        async with await _aio.connect(cfg.brokers, failover=True, failover_timeout=10) as conn:
            await conn.accept_through(
                cfg.queue, position, f"spark:{cfg.queue}", service=service, token=token
            )
    except BatonError as exc:  # Spark's own commit comes later anyway
        log.warning("accepting the committed entries below %d failed: %s", position, exc)


# --- the command line (``baton import-entries``) -------------------------------------------


def add_arguments(p: Any) -> None:
    """Add ``run`` and ``generate`` to the ``baton import-entries`` argparse parser."""
    sub = p.add_subparsers(dest="action", required=True)
    brokers_help = "broker addresses, HOST:PORT[,HOST:PORT...]"

    r = sub.add_parser("run", help="run a pipeline instance (runs the query while it leads)")
    r.add_argument("--brokers", required=True, help=brokers_help)
    r.add_argument("--queue", default="import-entries")
    r.add_argument("--table", required=True, help="the table's directory (Parquet or Delta)")
    r.add_argument("--checkpoint", required=True, help="Spark's checkpoint directory")
    r.add_argument("--dlq", default=None, help="dead-letter queue (default: <queue>.dlq)")
    r.add_argument("--service", default="import-entries", help="the leadership service name")
    r.add_argument("--no-leadership", action="store_true",
                   help="run the query at once, without running for leadership")
    r.add_argument("--trigger", type=float, default=1.0, help="seconds between micro-batches")
    r.add_argument("--max-per-trigger", type=int, default=100_000)
    r.add_argument("--master", default="local[2]", help="Spark master")
    r.add_argument("--stop-when-idle", type=float, default=None, metavar="SECONDS",
                   help="stop after this many seconds without new entries")

    g = sub.add_parser("generate", help="publish realistic import entries")
    g.add_argument("--brokers", required=True, help=brokers_help)
    g.add_argument("--queue", default="import-entries")
    g.add_argument("--count", type=int, required=True)
    g.add_argument("--batch", type=int, default=500)
    g.add_argument("--rate", type=float, default=None, help="entries per second (default: max)")
    g.add_argument("--invalid-ratio", type=float, default=0.01)
    g.add_argument("--run", default=None, help="key prefix (default: random)")
    g.add_argument("--seed", type=int, default=None)


def run_from_args(args: Any) -> int:
    """Run ``baton import-entries run|generate``."""
    import signal

    import uvloop

    if args.action == "generate":
        result = uvloop.run(
            publish_entries(
                args.brokers, args.queue, args.count, batch=args.batch, rate=args.rate,
                invalid_ratio=args.invalid_ratio, run=args.run, seed=args.seed,
            )
        )
        print(json.dumps(result))
        return 0
    cfg = PipelineConfig(
        brokers=args.brokers, queue=args.queue, table=args.table, checkpoint=args.checkpoint,
        dlq=args.dlq, service=args.service, leadership=not args.no_leadership,
        trigger_seconds=args.trigger, max_per_trigger=args.max_per_trigger,
        master=args.master, stop_when_idle=args.stop_when_idle,
    )

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await run_pipeline(cfg, stop)

    # Plain asyncio: pyspark's py4j calls run in threads (asyncio.to_thread).
    return asyncio.run(main())
