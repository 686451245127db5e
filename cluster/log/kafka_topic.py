"""The Kafka topic a log set is, and the clients its partitions share (docs/design.md §3).

:class:`KafkaTopic` connects to Kafka (the admin client and one consumer for offset queries,
shared by every partition of a :class:`~batonmq.cluster.log.kafka.KafkaLogSet`, or owned by a
lone :class:`~batonmq.cluster.log.kafka.KafkaLog`), creates and checks the topic, adds
partitions, and turns what aiokafka raises into Baton's errors (:meth:`KafkaTopic.guard`),
finding out why Kafka cannot be reached when it can be told (a refused login, TLS). What a
partition does with it (append, read, retention) is in :mod:`batonmq.cluster.log.kafka`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
    for_code,
)

from batonmq.cluster.errors import BatonError, InvalidArgument, LogUnavailable
from batonmq.cluster.log.kafka_url import KafkaURL

__all__ = ["KafkaTopic", "MAX_BATCH_BYTES", "BATCH_HEADER", "RECORD_OVERHEAD", "CLOSE_GRACE", "client_ids"]

_log = logging.getLogger(__name__)

#: Largest Kafka record batch (so the largest append) on a topic Baton creates: the topic's
#: ``max.message.bytes``. The producer's request size and the consumers' fetch sizes match it.
#: An existing topic with a smaller ``max.message.bytes`` lowers it.
MAX_BATCH_BYTES = 16 << 20
# Upper bounds of what Kafka's record batch format (v2) adds, so a batch's size is known before
# it is built: a 61-byte batch header, and per record at most 5 (length) + 1 (attributes) +
# 10 (timestamp delta) + 5 (offset delta) + 1 (null key) + 5 (value length) + 1 (no headers).
BATCH_HEADER = 61
RECORD_OVERHEAD = 28
#: A close waits at most this long for an append in flight, for readers, for a client to stop.
CLOSE_GRACE = 5.0

_DIAGNOSE_SECONDS = 10.0  # at most this long to find out why Kafka could not be reached
_TOPIC_ALREADY_EXISTS = 36
_INVALID_PARTITIONS = 37  # CreatePartitions: e.g. the topic already has that many
_UNKNOWN_TOPIC, _NO_LEADER = 3, 5  # describe: not (yet) known, a partition without a leader
# CreateTopics errors that mean the URL asks for something this Kafka cannot do.
_BAD_REQUEST_CODES = {17, 37, 38, 39, 40, 42, 44}  # invalid topic/partitions/RF/assignment/config/request, policy

#: Numbers the client ids of every aiokafka client the log makes.
client_ids = itertools.count(1)


def _tls_alert(exc: BaseException) -> bool:
    """Whether a connection aiokafka saw closed had been answered with a TLS alert record
    (type 21, version 3.x), which aiokafka read as the length of a Kafka response."""
    cause = exc.__cause__
    if not isinstance(cause, asyncio.IncompleteReadError) or cause.expected is None:
        return False
    return cause.expected >> 16 == 0x1503


class KafkaTopic:
    """One Kafka topic and the clients every partition of it shares. Call :meth:`connect`.

    Args:
        url: the log URL (for messages).
        where: the parsed URL.
        security: aiokafka's security options, the same for every client the log makes.
        password_from: where the SASL password came from, for the errors about a login.

    Attributes:
        admin: the admin client (after :meth:`connect`).
        offsets: a started consumer with no assignment, for offset queries.
        max_batch: the largest Kafka record batch this topic takes (its ``max.message.bytes``,
            at most :data:`MAX_BATCH_BYTES`).
    """

    def __init__(
        self, url: str, where: KafkaURL, security: dict[str, Any] | None = None, password_from: str = ""
    ) -> None:
        self.url = url
        self.where = where
        self.security: dict[str, Any] = dict(security or {"security_protocol": "PLAINTEXT"})
        self.password_from = password_from
        self.timeout = where.request_timeout_ms / 1000
        self.max_batch = MAX_BATCH_BYTES
        self.admin: Any = None
        self.offsets: Any = None

    async def stop_consumer(self, consumer: Any) -> None:
        """Stop a consumer, bounded; its connections are closed even when stop() fails."""
        if not await self.quietly(consumer.stop(), "stopping a consumer"):
            # aiokafka 0.14's fetcher lets a CancelledError out of stop() when a fetch was
            # retrying a dead Kafka, before it closes the connections: close them here.
            client = getattr(consumer, "_client", None)
            if client is not None:
                await self.quietly(client.close(), "closing a consumer's connections")

    def consumer(self) -> Any:
        """A consumer without a group, sized for this topic's batches (not started)."""
        return AIOKafkaConsumer(
            bootstrap_servers=self.where.bootstrap,
            client_id=f"baton-log-consumer-{next(client_ids)}",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",  # an offset out of range is an error, never a silent jump
            isolation_level="read_uncommitted",
            max_partition_fetch_bytes=self.max_batch,
            fetch_max_bytes=max(self.max_batch, 50 << 20),
            request_timeout_ms=self.where.request_timeout_ms,
            **self.security,
        )

    async def close(self) -> None:
        """Stop the offsets consumer and the admin client."""
        if self.offsets is not None:
            await self.stop_consumer(self.offsets)
        if self.admin is not None:
            await self.quietly(self.admin.close(), "closing the admin client")

    async def connect(self, partitions: int = 1) -> int:
        """Connect, create the topic (with ``partitions``) if missing, check it; returns how
        many partitions the topic has."""
        where = self.where
        self.admin = AIOKafkaAdminClient(
            bootstrap_servers=where.bootstrap,
            client_id=f"baton-log-admin-{next(client_ids)}",
            request_timeout_ms=where.request_timeout_ms,
            **self.security,
        )
        async with self.guard("connecting"):
            await self.admin.start()
        async with self.guard(f"creating topic {where.topic!r}"):
            created = await self._create(partitions)
        if not created:
            async with self.guard(f"checking topic {where.topic!r}"):
                partitions = await self._check()
        self.offsets = self.consumer()
        async with self.guard("starting a consumer"):
            await self.offsets.start()
        return partitions

    async def _create(self, partitions: int = 1) -> bool:
        """Create the topic with ``partitions`` partitions; False if it exists already."""
        where = self.where
        configs = {
            "max.message.bytes": str(MAX_BATCH_BYTES),
            "min.insync.replicas": str(where.min_insync_replicas),
            "retention.ms": "-1",  # Kafka never drops records by age or size; Baton truncates
            "retention.bytes": "-1",
            "cleanup.policy": "delete",  # never compact: offsets must stay dense
            "unclean.leader.election.enable": "false",  # never lose acknowledged appends
        }
        topic = NewTopic(where.topic, partitions, where.replication_factor, topic_configs=configs)
        response = await self.admin.create_topics([topic], timeout_ms=where.request_timeout_ms)
        for _name, code, *rest in response.topic_errors:
            if code == 0:
                _log.info(
                    "created Kafka topic %r (%d partition(s), replication factor %d, min ISR %d)",
                    where.topic, partitions, where.replication_factor, where.min_insync_replicas,
                )
                return True
            if code == _TOPIC_ALREADY_EXISTS:
                return False
            error = for_code(code)
            detail = rest[0] if rest and rest[0] else error.description
            kind = InvalidArgument if code in _BAD_REQUEST_CODES else LogUnavailable
            raise kind(
                f"Kafka at {where.bootstrap} refused to create topic {where.topic!r}: "
                f"{detail} ({error.__name__})"
            )
        raise LogUnavailable(f"Kafka at {where.bootstrap} did not say whether it created {where.topic!r}")

    async def partition_count(self, least: int = 1, led: range = range(0)) -> int:
        """How many partitions the topic has, once Kafka's metadata shows at least ``least``
        of them and a leader for each partition in ``led`` (a topic or partitions just
        created, maybe by another process, take a moment to appear). Bounded by the
        caller's :meth:`guard`."""
        topic = self.where.topic
        while True:
            (described,) = await self.admin.describe_topics([topic])
            code = described["error_code"]
            parts = described["partitions"]
            leaders = {p["partition"] for p in parts if p["error_code"] != _NO_LEADER and p["leader"] >= 0}
            if code not in (_UNKNOWN_TOPIC, _NO_LEADER) and len(parts) >= least and set(led) <= leaders:
                break
            await asyncio.sleep(0.1)
        if code:
            error = for_code(code)
            raise LogUnavailable(f"Kafka cannot describe topic {topic!r}: {error.__name__}")
        return len(parts)

    async def grow(self, count: int, known: int) -> None:
        """Give the topic at least ``count`` partitions (CreatePartitions); returns once
        the metadata shows them, partitions ``known..count-1`` each with a leader.
        Call it within :meth:`guard`.

        Raises:
            InvalidArgument: Kafka refused, and the topic has fewer than ``count``.
        """
        topic = self.where.topic
        try:
            await self.admin.create_partitions(
                {topic: NewPartitions(count)}, timeout_ms=self.where.request_timeout_ms
            )
            _log.info("Kafka topic %r grown to %d partitions", topic, count)
        except KafkaError as exc:
            # Another process grew it first (Kafka says the topic already has that many or
            # more); anything else is refused here if the topic is still short.
            if getattr(exc, "errno", None) != _INVALID_PARTITIONS:
                raise
            have = await self.partition_count()
            if have < count:
                raise InvalidArgument(
                    f"Kafka refused to grow topic {topic!r} from {have} to {count} partitions: {exc}"
                ) from exc
        await self.partition_count(count, range(known, count))

    async def _check(self) -> int:
        """An existing topic must be usable as a log (not compacted); returns its partitions."""
        topic = self.where.topic
        partitions = await self.partition_count()
        (response,) = await self.admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        code, message, _type, _name, entries = response.resources[0][:5]
        if code:
            raise LogUnavailable(f"Kafka cannot describe the configuration of topic {topic!r}: {message}")
        config = {entry[0]: entry[1] for entry in entries}
        if "compact" in str(config.get("cleanup.policy", "")):
            raise InvalidArgument(
                f"Kafka topic {topic!r} is compacted (cleanup.policy={config['cleanup.policy']}); "
                "a Baton log must keep every record"
            )
        limit = str(config.get("max.message.bytes", ""))
        if limit.isdigit() and int(limit) < self.max_batch:
            self.max_batch = int(limit)
        if config.get("retention.ms") not in (None, "-1") or config.get("retention.bytes") not in (None, "-1"):
            _log.warning(
                "Kafka topic %r has retention.ms=%s retention.bytes=%s: Kafka may delete records "
                "that brokers still need; set both to -1",
                topic, config.get("retention.ms"), config.get("retention.bytes"),
            )
        return partitions

    @contextlib.asynccontextmanager
    async def guard(self, what: str) -> AsyncIterator[None]:
        """Bound a Kafka call in time and turn what it raises into Baton's errors."""
        where = self.where.bootstrap
        try:
            async with asyncio.timeout(self.timeout):
                yield
        except BatonError:
            raise
        except TimeoutError as exc:
            raise LogUnavailable(f"Kafka at {where}: {what} got no answer within {self.timeout:g}s") from exc
        except KafkaConnectionError as exc:
            # aiokafka reports any failed bootstrap as "Unable to bootstrap", whether Kafka is
            # down or refused the login, the certificate or the protocol: find out which.
            why = await self._why_not_connected() if "bootstrap" in str(exc) else None
            if why is not None:
                raise LogUnavailable(f"{why} ({what})") from None
            raise LogUnavailable(f"Kafka at {where} unreachable ({what}): {exc}") from exc
        except SaslAuthenticationFailed as exc:
            raise LogUnavailable(f"{self._login_refused(where, exc)} ({what})") from None
        except (KafkaError, OSError) as exc:
            raise LogUnavailable(f"Kafka at {where}: {what} failed: {exc}") from exc

    async def _why_not_connected(self) -> str | None:
        """Why connecting to the bootstrap servers fails, if it is the login, TLS or the
        security protocol (None when they are merely unreachable, or answer now): one
        connection per server, as aiokafka makes them, within :data:`_DIAGNOSE_SECONDS` in all."""
        where = self.where
        protocol = f"security_protocol={where.security_protocol} in the log URL"
        try:
            async with asyncio.timeout(min(self.timeout, _DIAGNOSE_SECONDS)):
                for server in where.servers:
                    host, _, port = server.rpartition(":")
                    try:
                        conn = await create_conn(
                            host.strip("[]"), int(port), client_id="baton-log-check",
                            request_timeout_ms=where.request_timeout_ms, **self.security,
                        )
                    except SaslAuthenticationFailed as exc:
                        return self._login_refused(server, exc)
                    except UnsupportedSaslMechanismError:
                        return (
                            f"Kafka at {server} does not offer SASL mechanism {where.sasl_mechanism} "
                            "on that listener (sasl_mechanism in the log URL)"
                        )
                    except ssl.SSLCertVerificationError as exc:
                        trusted = f"ssl_cafile {where.ssl_cafile}" if where.ssl_cafile else "the system's CAs"
                        return (
                            f"the TLS certificate of Kafka at {server} does not verify against "
                            f"{trusted}: {exc.verify_message or exc}"
                        )
                    except ssl.SSLError as exc:
                        return (
                            f"the TLS handshake with Kafka at {server} failed ({exc.reason or exc}): "
                            f"does that listener speak TLS? ({protocol})"
                        )
                    except ConnectionResetError:
                        if where.tls:
                            return (
                                f"Kafka at {server} reset the connection during the TLS handshake: "
                                f"does that listener speak TLS? ({protocol})"
                            )
                        continue
                    except KafkaConnectionError as exc:
                        if not where.tls and _tls_alert(exc):
                            return (
                                f"Kafka at {server} answered in TLS: that listener expects TLS "
                                f"(security_protocol=SSL or SASL_SSL), not {where.security_protocol}"
                            )
                        continue
                    except (OSError, KafkaError, TimeoutError):
                        continue
                    conn.close()
                    return None
        except TimeoutError:
            pass
        return None

    def _login_refused(self, server: str, exc: BaseException) -> str:
        said = str(exc.args[0]) if exc.args else type(exc).__name__
        return (
            f"Kafka at {server} refused the login of {self.where.sasl_username!r} with "
            f"{self.where.sasl_mechanism}: {said}; check the password ({self.password_from}) "
            "and the user's credentials on Kafka"
        )

    async def quietly(self, closing: Any, what: str) -> bool:
        """Await a stop/close call, bounded; failing is only logged. True if it completed."""
        try:
            async with asyncio.timeout(CLOSE_GRACE):
                try:
                    await closing
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # we are being cancelled (or timed out): not aiokafka's leak
                    _log.debug("%s: %s let a CancelledError out", self.url, what)
                    return False
        except Exception as exc:
            _log.debug("%s: %s failed: %r", self.url, what, exc)
            return False
        return True
