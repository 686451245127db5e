"""The Baton broker process: client listener, sessions, consumers, delivery, CLI.

It drives :mod:`cluster` and :mod:`store` and owns no replicated logic. The names
below are imported when first used, so that the ``baton`` command starts (and a Ctrl-C
in its first moments ends it quietly) without loading the broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batonmq.broker.config import BrokerConfig
    from batonmq.broker.server import VERSION, Broker

__all__ = ["Broker", "BrokerConfig", "VERSION"]


def __getattr__(name: str) -> Any:
    if name == "BrokerConfig":
        from batonmq.broker.config import BrokerConfig

        return BrokerConfig
    if name in ("Broker", "VERSION"):
        from batonmq.broker import server

        return getattr(server, name)
    raise AttributeError(f"module 'batonmq.broker' has no attribute {name!r}")
