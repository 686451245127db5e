"""How far this broker is behind each log it applies: a log's end and the apply lag.

The lag of a log is the records on it not applied here yet: its end (the offset its
next record gets) minus 1 minus the offset applied. Reading an end asks the log (a file
log's thread, a Kafka broker), so every read has a deadline: a scrape, a probe or a
topology on a dead Kafka waits :data:`LOG_QUERY_TIMEOUT` seconds at most and reports
the end, and so the lag, as unknown (None), never as 0. Used by /metrics and /readyz
(broker/admin.py), and the topology's data partitions (broker/server.py). Loads no
aiohttp or prometheus_client: the broker imports it whether or not its admin API runs.
"""

from __future__ import annotations

import asyncio

from batonmq.cluster.node import Node

__all__ = ["LOG_QUERY_TIMEOUT", "apply_lag", "partition_log_ends"]

#: Seconds a probe or a scrape waits for the log's offsets (a hung log must not hang them).
LOG_QUERY_TIMEOUT = 2.0


def apply_lag(log_end: int | None, applied: int) -> int | None:
    """Records on a log not applied here yet.

    Args:
        log_end: the log's end (the offset its next record gets); None if unknown.
        applied: the last offset applied here (-1: none).

    Returns:
        ``log_end - 1 - applied`` (at least 0), or None when the end is unknown.
    """
    return None if log_end is None else max(0, log_end - 1 - applied)


async def partition_log_ends(node: Node) -> dict[int, int | None]:
    """Each data partition's log end, by partition number; empty for a log of one
    (docs/design.md §16).

    The partitions are asked together, each for at most :data:`LOG_QUERY_TIMEOUT`
    seconds; a log that fails or does not answer in time gives None (unknown).
    """

    async def end(n: Node) -> int | None:
        try:
            async with asyncio.timeout(LOG_QUERY_TIMEOUT):
                return await n.log.end_offset()
        except Exception:  # the log is down or slow: unknown, as for control's end
            return None

    data = node.parts()[1:]
    ends = await asyncio.gather(*(end(n) for n in data))
    return {n.partition: e for n, e in zip(data, ends)}
