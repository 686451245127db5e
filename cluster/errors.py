"""Baton's error hierarchy: one root, wire codes, and a code -> class mapping.

This module is a leaf (it imports nothing from Baton) so that every layer — the
client library, the broker, the replicated core and the store — raises the same
classes. An error that crosses the wire carries its ``code``; the receiving side
rebuilds the same class with :func:`for_code`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

__all__ = [
    "BatonError",
    "ProtocolError",
    "FrameTooLarge",
    "UnsupportedVersion",
    "UnknownCommand",
    "InvalidArgument",
    "JoinFailed",
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
    "AccessRefused",
    "StaleToken",
    "LogUnavailable",
    "LogCorrupt",
    "LogTruncated",
    "StoreError",
    "StoreCorrupt",
    "Fenced",
    "NotOwner",
    "ShuttingDown",
    "Timeout",
    "ConnectionClosed",
    "NotReplica",
    "PARTITION_CLOSED",
    "InternalError",
    "for_code",
]


class BatonError(Exception):
    """Root of every error Baton raises.

    Attributes:
        code: the numeric wire code (stable; documented in docs/protocol.md).
        retriable: True when the same command may succeed if sent again
            (possibly to another broker).
    """

    code: ClassVar[int] = 99
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__


class ProtocolError(BatonError):
    """A frame could not be decoded, or broke the protocol's rules."""

    code = 1


class FrameTooLarge(ProtocolError):
    """A frame is larger than the negotiated maximum frame size."""

    code = 2


class UnsupportedVersion(ProtocolError):
    """The peer speaks a protocol version this side does not."""

    code = 3


class UnknownCommand(ProtocolError):
    """The frame's op-code is not one this side knows."""

    code = 4


class InvalidArgument(BatonError):
    """A command's argument is out of range or of the wrong type."""

    code = 5


class QueueNotFound(BatonError):
    """The named queue does not exist."""

    code = 10


class PreconditionFailed(BatonError):
    """A command's precondition does not hold: an exchange exists with another type or
    other settings, or is still bound (AMQP's 406). :class:`QueueExists` is one."""

    code = 32


class QueueExists(PreconditionFailed):
    """A queue of that name exists with different settings.

    Attributes:
        differing: the settings that differ, as (name, the queue's value, the value
            asked for); empty when not known (an error decoded from the wire).
    """

    code = 11

    def __init__(
        self, message: str = "", differing: list[tuple[str, Any, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.differing = list(differing or [])


class ExchangeNotFound(BatonError):
    """The named exchange does not exist."""

    code = 31


class QueueFull(BatonError):
    """The queue is at its max_length and its overflow policy is reject-publish."""

    code = 12


class MessageTooLarge(BatonError):
    """A message body is larger than the broker's maximum message size."""

    code = 13


class UnknownConsumer(BatonError):
    """The consumer tag does not name a live consumer on this connection."""

    code = 14


class NotAcquired(BatonError):
    """The message is not acquired by this consumer (already settled or never delivered)."""

    code = 15


class QueueReserved(BatonError):
    """The queue is reserved for another reader (or not for this one): see Reserve in
    docs/protocol.md. Not retriable: the holder must release it first."""

    code = 16


class AccessRefused(BatonError):
    """The connection did not authenticate (unknown user, wrong password, a user
    that may not connect from there), or its user lacks the right for this command
    (docs/security.md). Not retriable: the same command is refused again."""

    code = 18


class StaleToken(BatonError):
    """A range commit (``Reserve``, ``AcceptThrough``) carried a fencing token that is not
    the current term's of its service: a newer leader took over (docs/spark.md). Not
    retriable: this writer no longer leads."""

    code = 19


class LogUnavailable(BatonError):
    """The ordered log cannot be written or read right now (disk full, Kafka down)."""

    code = 20
    retriable = True


class LogCorrupt(BatonError):
    """A log record failed its checksum somewhere other than a torn tail."""

    code = 21


class LogTruncated(BatonError):
    """The requested log offset was removed by retention (truncated away)."""

    code = 25


class Fenced(BatonError):
    """The broker is not in the cluster's established view: its events are ignored.

    Retry on another broker; this one rejoins by itself.
    """

    code = 26
    retriable = True


class NotOwner(BatonError):
    """Only the queue's current owner may acquire its messages (docs/design.md §6)."""

    code = 27
    retriable = True


class JoinFailed(BatonError):
    """A joining broker could not get the cluster's state from a member (docs/design.md §8):
    none answered, or the update broke off. The joiner retries with another member."""

    code = 28
    retriable = True


class StoreError(BatonError):
    """The broker's local store (rocksdict) failed."""

    code = 22


class StoreCorrupt(StoreError):
    """The broker's local store failed a checksum or a size check (damaged files): the
    broker sets it aside and joins as a fresh broker (docs/operations.md)."""

    code = 29


class ShuttingDown(BatonError):
    """The broker is shutting down; retry on another broker or later."""

    code = 23
    retriable = True


#: What a broker says of a queue whose data partition it no longer applies (its group
#: changed): in a ``ShuttingDown`` of a command in flight then, and when it cancels the
#: queue's consumers. The client's router sends such a command to a current replica
#: (clients/routing.py): it matches this text.
PARTITION_CLOSED: Final = "is served by other brokers now"


class Timeout(BatonError):
    """An operation did not complete in time; its outcome is unknown."""

    code = 24
    retriable = True


class ConnectionClosed(BatonError):
    """The connection closed before the command completed; its outcome is unknown."""

    code = 30
    retriable = True


class LimitExceeded(BatonError):
    """A limit of the connection or the broker (connections, consumers, prefetch;
    docs/security.md). Retriable: another broker, or the same later, may have room."""

    code = 17
    retriable = True


class NotReplica(BatonError):
    """A broker was asked, over a peer link, to append to a data partition it does not
    replicate (docs/design.md §16): the forwarding broker tries another replica. A
    client gets it for the stats of a queue on a partition its broker does not
    replicate: the message names the brokers that do."""

    code = 33
    retriable = True


class InternalError(BatonError):
    """A bug in Baton. The broker keeps running; please report it."""

    code = 99


_BY_CODE: dict[int, type[BatonError]] = {
    cls.code: cls
    for cls in (
        ProtocolError,
        FrameTooLarge,
        UnsupportedVersion,
        UnknownCommand,
        InvalidArgument,
        JoinFailed,
        QueueNotFound,
        QueueExists,
        ExchangeNotFound,
        PreconditionFailed,
        QueueFull,
        MessageTooLarge,
        UnknownConsumer,
        NotAcquired,
        QueueReserved,
        StaleToken,
        LogUnavailable,
        LogCorrupt,
        LogTruncated,
        Fenced,
        NotOwner,
        StoreError,
        StoreCorrupt,
        ShuttingDown,
        Timeout,
        ConnectionClosed,
        LimitExceeded,
        AccessRefused,
        NotReplica,
        InternalError,
    )
}


def for_code(code: int, message: str = "") -> BatonError:
    """Build the error instance for a wire ``code`` (unknown codes give BatonError).

    Args:
        code: the numeric code from an Error frame.
        message: the human-readable message that came with it.

    Returns:
        An instance of the matching BatonError subclass.
    """
    cls = _BY_CODE.get(code)
    if cls is None:
        err = BatonError(f"[code {code}] {message}")
        return err
    return cls(message)
