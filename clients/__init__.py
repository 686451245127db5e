"""Baton's Python client library.

The one entry point is the package itself: ``from batonmq import clients``. Everything a
user needs is a name of :data:`__all__` on it, wherever it is defined:

* ``clients.connect`` opens an async :class:`Connection`; ``clients.sync`` is the
  blocking client module, whose ``clients.sync.connect`` has the same calls;
* ``clients.Connection``, ``clients.Consumer``, ``clients.Message``, ``clients.Term``
  and the other result types, ``clients.TopologyWatch`` and the topology events;
* the error classes (``clients.BatonError`` and its subclasses, also in
  ``clients.errors``), ``clients.wire`` and ``clients.PROTOCOL_VERSION``.

Async::

    from batonmq import clients

    async with await clients.connect("127.0.0.1:5671") as conn:
        await conn.publish("orders", b"body")

Blocking: ``clients.sync.connect(...)`` with the same calls. See docs/client.md.
TLS: ``clients.connect(..., ssl=clients.tls.client_context("ca.pem"))`` (docs/security.md).

The modules behind it (:mod:`~batonmq.clients.client` the facade,
:mod:`~batonmq.clients.conn`, :mod:`~batonmq.clients.failover`,
:mod:`~batonmq.clients.producer`, :mod:`~batonmq.clients.consumer`,
:mod:`~batonmq.clients.watch`, :mod:`~batonmq.clients.leadership`) are the library's
inside: import from the package, not from them.

This package is also imported by the broker and the cluster core for
:mod:`batonmq.clients.wire` and :mod:`batonmq.cluster.errors`, so importing it must stay cheap and
must not import anything outside ``clients/`` (nor the Spark source or the
import-entries pipeline, which load pyspark).
"""

from __future__ import annotations

from batonmq.clients import errors, leadership, sync, tls, topology, wire
from batonmq.clients.client import Connection, Retry, connect
from batonmq.clients.consumer import Consumer, Message
from batonmq.cluster.errors import (
    BatonError,
    ConnectionClosed,
    ExchangeNotFound,
    FrameTooLarge,
    InternalError,
    InvalidArgument,
    LimitExceeded,
    LogCorrupt,
    LogTruncated,
    LogUnavailable,
    MessageTooLarge,
    NotAcquired,
    PreconditionFailed,
    ProtocolError,
    QueueExists,
    QueueFull,
    QueueNotFound,
    QueueReserved,
    ShuttingDown,
    StaleToken,
    StoreError,
    StoreCorrupt,
    Timeout,
    UnknownCommand,
    UnknownConsumer,
    UnsupportedVersion,
)
from batonmq.clients.leadership import HandoverResult, ServiceInfo, Term
from batonmq.clients.topology import Topology, TopologyEvent, TopologyEventType
from batonmq.clients.watch import TopologyWatch
from batonmq.clients.wire import PROTOCOL_VERSION

__all__ = [
    "connect",
    "Connection",
    "Retry",
    "Consumer",
    "Message",
    "sync",
    "tls",
    "errors",
    "wire",
    "topology",
    "Topology",
    "TopologyEvent",
    "TopologyEventType",
    "TopologyWatch",
    "leadership",
    "Term",
    "ServiceInfo",
    "HandoverResult",
    "PROTOCOL_VERSION",
    "BatonError",
    "ProtocolError",
    "FrameTooLarge",
    "UnsupportedVersion",
    "UnknownCommand",
    "InvalidArgument",
    "QueueNotFound",
    "QueueExists",
    "ExchangeNotFound",
    "PreconditionFailed",
    "QueueFull",
    "MessageTooLarge",
    "UnknownConsumer",
    "NotAcquired",
    "QueueReserved",
    "LimitExceeded",
    "StaleToken",
    "LogUnavailable",
    "LogCorrupt",
    "LogTruncated",
    "StoreError",
    "StoreCorrupt",
    "ShuttingDown",
    "Timeout",
    "ConnectionClosed",
    "InternalError",
]
