"""A message's own TTL and its deaths at the AMQP edge (docs/amqp.md "Message TTL").

* :func:`message_ttl`: AMQP's ``expiration`` property as the TTL an ``Enqueue`` carries
  (flag ``message_ttl``; before the flag is enabled the property is kept and not
  enforced, as by builds before it);
* :func:`with_x_death`: a dead letter's headers as RabbitMQ delivers them: the
  ``x-death`` array, ``x-first-death-*`` and ``x-last-death-*``, built from what the
  state machine recorded when it dead-lettered the message (``x-death-*``, events.md
  "Dead-lettering"), and without its ``expiration`` (kept as the entry's
  ``original-expiration``, so that a dead letter does not expire again).
"""

from __future__ import annotations

import datetime
from typing import Any, Final, Protocol

from batonmq.broker.amqp_codec import ChannelError
from batonmq.broker.amqp_message import PROPERTIES_KEY, ROUTE_EXCHANGE, ROUTE_KEY
from batonmq.cluster.queue_state import MAX_TTL_MS

__all__ = ["FLAG", "message_ttl", "with_x_death"]

#: The feature flag that enforces a message's own TTL (cluster/features.py).
FLAG: Final = "message_ttl"

#: Baton's dead-letter reasons as RabbitMQ names them in ``x-death``.
_REASONS: Final = {"delivery-limit": "delivery_limit"}


class _Enabled(Protocol):
    enabled: dict[str, int]


class _State(Protocol):
    @property
    def features(self) -> _Enabled: ...


def message_ttl(expiration: str | None, state: _State) -> int | None:
    """The TTL (ms) a publish with AMQP ``expiration`` carries: None without one, or
    while the flag ``message_ttl`` is off (the property is then only kept).

    Raises:
        ChannelError: 406, the expiration is not a whole number of ms 0..2^32-1 (as
            RabbitMQ refuses it).
    """
    if expiration is None or expiration == "" or FLAG not in state.features.enabled:
        return None
    text = expiration.strip()
    if not text.isdigit() or int(text) > MAX_TTL_MS:
        raise ChannelError(406, f"PRECONDITION_FAILED - invalid expiration {expiration!r}:"
                                f" must be a whole number of ms, 0..{MAX_TTL_MS}")
    return int(text)


def with_x_death(headers: dict[str, Any], publish_time: int) -> dict[str, Any]:
    """A dead letter's headers with RabbitMQ's ``x-death`` array (the latest death
    first, then the first one if it was another queue or reason), ``x-first-death-*``
    and ``x-last-death-*``; its ``expiration`` moves into the entries. Headers without
    ``x-death-reason`` (not a dead letter) come back as they are.

    ``count`` is 1 per entry: Baton records a message's first and latest death, not
    how often it died in each queue. ``time`` is when the message was published
    (``publish_time``, ms): the time of a death is not recorded."""
    reason = headers.get("x-death-reason")
    queue = headers.get("x-death-queue")
    if not isinstance(reason, str) or not isinstance(queue, str):
        return headers
    out = dict(headers)
    fixed = out.get(PROPERTIES_KEY)
    expiration: Any = None
    exchange, keys = "", [queue]
    if isinstance(fixed, dict):
        fixed = dict(fixed)
        expiration = fixed.pop("expiration", None)
        if isinstance(fixed.get(ROUTE_EXCHANGE), str) and isinstance(fixed.get(ROUTE_KEY), str):
            exchange, keys = fixed[ROUTE_EXCHANGE], [fixed[ROUTE_KEY]]
        out[PROPERTIES_KEY] = fixed
    when = datetime.datetime.fromtimestamp(max(0, publish_time) // 1000, tz=datetime.UTC)

    def entry(why: str, where: str) -> dict[str, Any]:
        e: dict[str, Any] = {
            "count": 1, "reason": _REASONS.get(why, why), "queue": where, "time": when,
            "exchange": exchange, "routing-keys": list(keys),
        }
        if isinstance(expiration, str):
            e["original-expiration"] = expiration
        return e

    deaths = [entry(reason, queue)]
    first_reason = headers.get("x-first-death-reason")
    first_queue = headers.get("x-first-death-queue")
    if (isinstance(first_reason, str) and isinstance(first_queue, str)
            and (first_reason, first_queue) != (reason, queue)):
        deaths.append(entry(first_reason, first_queue))
    out["x-death"] = deaths
    # (RabbitMQ's *-death-exchange is the exchange the message was published to, as
    # the entries' "exchange"; the state wrote the dead-letter exchange there)
    if len(deaths) == 1:
        out["x-first-death-reason"] = deaths[0]["reason"]
        out["x-first-death-queue"] = queue
        out["x-first-death-exchange"] = exchange
    else:
        out["x-first-death-reason"] = deaths[1]["reason"]
    out["x-last-death-reason"] = deaths[0]["reason"]
    out["x-last-death-queue"] = queue
    out["x-last-death-exchange"] = exchange
    return out
