"""Checkpoints and log retention (docs/design.md §8).

The leader appends a :class:`~batonmq.cluster.events.Checkpoint` every
``checkpoint_ms``, carrying its state digest at the previous checkpoint; every
replica compares its own digest there when it applies it (:meth:`Checkpoints.checked`),
and a difference is reported loudly. After a checkpoint the leader truncates the log
below an older checkpoint, :data:`RETAIN` checkpoints back (30 s at the default
interval), once every live runtime has applied past it. The margin is for runtimes the
membership does not count as live at that moment: a joiner whose first heartbeat is not
applied yet, a broker briefly suspected (paused, cut off, busy catching up). Truncating
right behind the last checkpoint cut such brokers off, and each had to join again as a
new one, over and over under load.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from batonmq.cluster.effects import CheckpointApplied
from batonmq.cluster.errors import BatonError
from batonmq.cluster.events import Checkpoint
from batonmq.cluster.health import Health
from batonmq.cluster.log import Log
from batonmq.cluster.results import Checkpointed
from batonmq.cluster.state import State

__all__ = ["Checkpoints", "RETAIN"]

#: The leader truncates the log below the checkpoint this many checkpoints back.
RETAIN = 6

log = logging.getLogger("baton.node")


class Checkpoints:
    """The leader's checkpoints and truncation, and every replica's digest check.

    Args:
        key: this runtime's member key (it checkpoints while it leads).
        state: the replicated state.
        log: the ordered log (truncated here).
        health: no checkpoint while the replica is not healthy.
        joined: set while this runtime is in the established view.
        submit: appends an event; resolves once durable and applied.
        interval_ms: how often the leader checkpoints; 0: never.
        retain: truncate below the checkpoint this many back (at least 2).
    """

    def __init__(
        self,
        key: str,
        state: State,
        log: Log,
        health: Health,
        joined: asyncio.Event,
        submit: Callable[[Checkpoint], asyncio.Future[Checkpointed]],
        interval_ms: int,
        retain: int = RETAIN,
    ) -> None:
        self.key = key
        self.state = state
        self.log = log
        self.health = health
        self.joined = joined
        self.submit = submit
        self.interval_ms = interval_ms
        self.last: dict[str, Any] | None = None  # the last checkpoint applied here
        self.digest_mismatches = 0
        self.truncated_before = 0  # the log's start offset after our last truncation
        self._truncate_asked = 0
        # The offsets of the last ``retain`` checkpoints applied here, oldest first.
        self._recent: deque[int] = deque(maxlen=max(2, retain))

    async def run(self) -> None:
        """While this runtime leads, checkpoint every ``interval_ms`` and truncate."""
        if self.interval_ms <= 0:
            return
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            ms = self.state.membership
            if not self.joined.is_set() or ms.leader() != self.key or not self.health.ok:
                continue
            prev = self.state.checkpoints[-1] if self.state.checkpoints else (-1, "")
            try:
                await asyncio.wait_for(self.submit(Checkpoint(prev[0], prev[1])), 30)
                await self._truncate()
            except (BatonError, TimeoutError) as exc:
                # A timeout has no message: say what it was.
                why = str(exc) or (
                    "not applied within 30 s" if isinstance(exc, TimeoutError) else ""
                )
                log.warning("checkpoint failed: %s: %s", type(exc).__name__, why)

    async def _truncate(self) -> None:
        """Drop the log below the checkpoint ``retain`` back, once every live runtime
        has applied past it (and no update being served still needs it)."""
        recent = self._recent
        if len(recent) < (recent.maxlen or 2):
            return
        target = recent[0]
        hold = self.state.membership.hold()
        if hold is None or hold <= target or target <= self._truncate_asked:
            return
        self._truncate_asked = target
        await self.log.truncate_before(target)
        # What is really gone: a file log deletes whole segments only.
        self.truncated_before = await self.log.start_offset()
        log.debug("log truncated before offset %d (asked %d)", self.truncated_before, target)

    def checked(self, e: CheckpointApplied) -> None:
        """A checkpoint applied here: compare this replica's digest at the previous one
        with the leader's (docs/design.md §8). A difference is a bug: say so loudly."""
        self.last = {"offset": e.offset, "digest": e.digest}
        self._recent.append(e.offset)
        if e.mine is None or not e.expected:
            return
        if e.mine != e.expected:
            self.digest_mismatches += 1
            log.critical(
                "REPLICA DIVERGED: state digest at log offset %d is %s here but %s on the"
                " leader; this replica's state is wrong (a bug): stop it and start it with"
                " a new data dir, and please report it",
                e.prev_offset, e.mine, e.expected,
            )
        else:
            self.last["verified"] = e.prev_offset
