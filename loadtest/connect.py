"""Open the client adapter of a system under test by its name.

Kept apart from :mod:`batonmq.loadtest.adapters` (the interface) so that the peers'
adapters, which implement that interface, and this registry, which imports them only
when they are asked for (their client libraries are optional), never import each other.
"""

from __future__ import annotations

from batonmq.loadtest.adapters import ADAPTERS, BatonAdapter, ClientAdapter
from batonmq.loadtest.workloads import Workload

__all__ = ["open_adapter"]


async def open_adapter(system: str, addresses: list[str], workload: Workload) -> ClientAdapter:
    """Connect to ``system`` (one of :data:`ADAPTERS`) at ``addresses``.

    Raises:
        ValueError: an unknown system.
    """
    if system == "baton":
        return await BatonAdapter.open(addresses)
    if system == "rabbitmq":
        from batonmq.loadtest.peers.rabbitmq import RabbitAdapter

        return await RabbitAdapter.open(addresses)
    if system == "nats":
        from batonmq.loadtest.peers.nats import NatsAdapter

        return await NatsAdapter.open(addresses, workload)
    raise ValueError(f"unknown system {system!r} (known: {', '.join(ADAPTERS)})")
