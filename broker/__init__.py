"""The Baton broker process: client listener, sessions, consumers, delivery, CLI.

It drives :mod:`cluster` and :mod:`store` and owns no replicated logic.
"""

from batonmq.broker.config import BrokerConfig
from batonmq.broker.server import VERSION, Broker

__all__ = ["Broker", "BrokerConfig", "VERSION"]
