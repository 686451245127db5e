"""What a queue is declared with, as the client says it and as ``DeclareQueue`` carries it:
the retry policy and the options map (docs/client.md, docs/protocol.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batonmq.cluster.errors import InvalidArgument

__all__ = ["Retry", "declare_options"]


@dataclass(frozen=True, slots=True)
class Retry:
    """A queue's retry policy: how long a message whose delivery failed waits before it is
    ready again (docs/client.md, "Retries and delays").

    Attributes:
        policy: ``"fixed"`` (always ``delay``), ``"linear"`` (``delay * n``) or
            ``"exponential"`` (``delay * 2 ** (n - 1)``), n being its delivery count.
        delay: seconds (at least 1 ms).
        max: the longest wait in seconds (None: no cap).
    """

    policy: str
    delay: float
    max: float | None = None

    def options(self) -> dict[str, Any]:
        """The DeclareQueue options that carry it."""
        return {
            "retry": self.policy,
            "retry_delay_ms": int(round(self.delay * 1000)),
            "retry_max_ms": None if self.max is None else int(round(self.max * 1000)),
        }


def declare_options(
    *,
    durable: bool,
    max_length: int | None,
    overflow: str,
    delivery_limit: int,
    dead_letter: str | None,
    message_ttl: float | None,
    retry: Retry | None,
    ack_timeout: float | None,
    max_priority: int | None,
    single_active_consumer: bool,
    dedupe_window: float | None,
    dead_letter_exchange: str | None = None,
    dead_letter_routing_key: str | None = None,
    partition: int | None = None,
    expires: float | None = None,
) -> dict[str, Any]:
    """The ``DeclareQueue`` options map of :meth:`Connection.declare_queue`'s arguments
    (seconds become ms; options left at their defaults are not sent, so an older broker
    that knows none of them still takes a plain declaration).

    Raises:
        InvalidArgument: ``retry`` is not a :class:`Retry`.
    """
    ttl_ms = None if message_ttl is None else int(round(message_ttl * 1000))
    options = {
        "durable": durable,
        "max_length": max_length,
        "overflow": overflow,
        "delivery_limit": delivery_limit,
        "dead_letter": dead_letter,
        "message_ttl_ms": ttl_ms,
    }
    if max_priority is not None:
        options["max_priority"] = max_priority
    if single_active_consumer:
        options["single_active_consumer"] = True
    if dedupe_window is not None:
        options["dedupe_window_ms"] = int(round(dedupe_window * 1000))
    if ack_timeout is not None:
        options["ack_timeout_ms"] = max(1, int(round(ack_timeout * 1000)))
    if dead_letter_exchange is not None:
        options["dead_letter_exchange"] = dead_letter_exchange
    if dead_letter_routing_key is not None:
        options["dead_letter_routing_key"] = dead_letter_routing_key
    if partition is not None:
        if type(partition) is not int or partition < 1:
            raise InvalidArgument(f"partition must be a data partition number, 1 or more, not {partition!r}")
        options["partition"] = partition
    if expires is not None:
        options["expires_ms"] = int(round(expires * 1000))  # (<= 0: the broker refuses it)
    if retry is not None:
        if not isinstance(retry, Retry):
            raise InvalidArgument(f"retry must be a clients.Retry, got {retry!r}")
        options.update(retry.options())
    return options
