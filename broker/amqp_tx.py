"""AMQP transactions on one channel: ``tx.select``, ``tx.commit``, ``tx.rollback``
(docs/amqp.md "Transactions").

As RabbitMQ: once a channel is transactional, its publishes and its settlements
(``Basic.Ack``, ``Basic.Nack``, ``Basic.Reject``) are *held* by the channel until
``tx.commit``, which submits them (the publishes first, in the order they came, merged
into one ``Enqueue`` per queue where the channel merges them anyway; then the
settlements) and answers ``Commit-Ok`` once every one is durable and applied on this
broker; ``tx.rollback`` drops the publishes and gives the settled deliveries back to the
client, unacked, to settle again. A delivery tag is checked when the settlement comes
(an unknown one closes the channel then), and settled once: settling it again within
the transaction is an unknown tag, as RabbitMQ.

Nothing of this is replicated: a transaction lives in its channel, on the broker the
client is connected to, and what it holds is lost with the channel. A commit is
written as the commands the channel would have written without the transaction, so it
needs no feature flag; what that promises (and does not) is in docs/amqp.md.

:class:`Transaction` is the pure part: what is held, the limits on it, and the outcome
of a commit's commands. broker/amqp_channel.py holds into it and submits from it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from batonmq.cluster.errors import QueueNotFound
from batonmq.cluster.results import Routed

__all__ = [
    "MAX_TX_BYTES",
    "MAX_TX_ITEMS",
    "NOT_TRANSACTIONAL",
    "PARTIAL",
    "TO_CONFIRM",
    "TO_TX",
    "TooLarge",
    "Transaction",
    "failed",
]

#: The most publishes and settlements one transaction holds (each settlement counts
#: its delivery tags) before the channel is closed (406): a transaction is held in the
#: broker's memory until its commit.
MAX_TX_ITEMS: Final = 100_000
#: The most bytes of message bodies one transaction holds.
MAX_TX_BYTES: Final = 256 * 1024 * 1024

#: RabbitMQ's reply texts (all 406 PRECONDITION_FAILED).
TO_CONFIRM: Final = "cannot switch from tx to confirm mode"
TO_TX: Final = "cannot switch from confirm to tx mode"
NOT_TRANSACTIONAL: Final = "channel is not transactional"
PARTIAL: Final = "partial tx completion"

P = TypeVar("P")  # a held publish (the channel's content)
S = TypeVar("S")  # a held delivery (the channel's consumer entry)


class TooLarge(Exception):
    """A transaction would hold more than :data:`MAX_TX_ITEMS` or :data:`MAX_TX_BYTES`."""


@dataclass(slots=True)
class Transaction(Generic[P, S]):
    """What a transactional channel holds until its commit.

    ``publishes``: the publishes, in order. ``settlements``: ``(how, [(tag, entry),
    ...])`` in order, ``how`` as the channel's settle kinds (accept, fail, release,
    reject); ``entry`` is what the channel's unacked map held for the tag.
    """

    publishes: list[P] = field(default_factory=list)
    settlements: list[tuple[str, list[tuple[int, S]]]] = field(default_factory=list)
    size: int = 0  # bytes of the held bodies
    items: int = 0

    def hold_publish(self, publish: P, size: int) -> None:
        """Hold a publish of ``size`` body bytes.

        Raises:
            TooLarge: the transaction would hold too much.
        """
        self._grow(1, size)
        self.publishes.append(publish)
        self.size += size

    def hold_settlement(self, how: str, entries: list[tuple[int, S]]) -> None:
        """Hold a settlement of these delivery tags.

        Raises:
            TooLarge: the transaction would hold too much.
        """
        if entries:
            self._grow(len(entries), 0)
            self.settlements.append((how, entries))

    def _grow(self, items: int, size: int) -> None:
        if self.items + items > MAX_TX_ITEMS or self.size + size > MAX_TX_BYTES:
            raise TooLarge(
                f"a transaction holds at most {MAX_TX_ITEMS} publishes and settlements and"
                f" {MAX_TX_BYTES // (1024 * 1024)} MiB of bodies: commit more often"
            )
        self.items += items

    def take(self) -> tuple[list[P], list[tuple[str, list[tuple[int, S]]]]]:
        """What is held, for a commit or a rollback; the transaction holds nothing then
        (and goes on: a channel stays transactional)."""
        held = (self.publishes, self.settlements)
        self.publishes, self.settlements = [], []
        self.size = self.items = 0
        return held


def failed(futures: list[tuple[asyncio.Future[Any], bool]]) -> bool:
    """Whether any of a commit's commands failed, each ``(future, settlement)``, all
    done: a publish that was refused (an error, or a queue full for a routed one); a
    settlement that failed but for its queue having gone (RabbitMQ ignores those)."""
    for fut, settlement in futures:
        if fut.cancelled():
            return True
        exc = fut.exception()
        if exc is not None:
            if settlement and isinstance(exc, QueueNotFound):
                continue
            return True
        result = fut.result()
        if isinstance(result, Routed) and result.full:
            return True
    return False
