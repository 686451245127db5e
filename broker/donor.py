"""The donor side of a join (docs/design.md §8): a broker streams its state to a joining one.

A joining broker connects as a client, says Hello with the MEMBER mechanism and sends
``UpdateRequest``; the session (broker/session.py) starts :meth:`UpdateDonor.serve` as a
task, which checks the joiner's member proof (cluster/member_proof.py), captures this
broker's state (cluster/update.py) and sends it chunk by chunk on that connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from batonmq.broker.connection import ClientConnection
from batonmq.clients import wire
from batonmq.cluster import member_proof, update
from batonmq.cluster.errors import AccessRefused, BatonError
from batonmq.cluster.node import Node
from batonmq.cluster.results import UpdateSent

__all__ = ["UpdateDonor"]

log = logging.getLogger("baton.session")


class UpdateDonor:
    """Serves one join update on one client connection.

    Args:
        conn: the joiner's connection.
        node: this broker's node (its state is what is sent).
        max_rate: messages/s sent at most (0: as fast as the joiner takes them).
    """

    def __init__(
        self,
        conn: ClientConnection,
        node: Node,
        max_rate: int,
        refused: Callable[[str], None] = lambda what: None,
    ) -> None:
        self._conn = conn
        self._refused = refused  # counts a refusal (the broker's access_refused)
        self._node = node
        self._rate = max_rate
        self._big = wire.FrameCodec(update.MAX_UPDATE_FRAME)  # encodes update frames

    async def serve(
        self,
        f: wire.UpdateRequest,
        member: tuple[str, bytes] | None,
        proven: Callable[[], None] = lambda: None,
    ) -> None:
        """Stream this broker's state to a joining broker (docs/design.md §8, cluster/update.py),
        chunk by chunk, waiting whenever the joiner's socket is full, so the clients of
        this broker keep being served in between.

        Only to a proven member: ``member`` is the session's (member, challenge) from its
        MEMBER Hello (None: it said no such Hello). Once this broker has applied the log
        up to ``since`` (so the joiner's Join), the request's proof must verify against
        the key that Join recorded (then ``proven`` is called: the session has logged
        in); else it is answered with AccessRefused and nothing is sent."""
        conn = self._conn
        node = self._node
        try:
            if member is not None:
                await update.wait_applied(node, f.since)
            member_proof.check(
                node.state.membership.join_keys, member, f.member, f.proof, node.node_id
            )
            proven()
            # A joiner whose build lacks an enabled flag could not read the state, nor
            # the log from there (cluster/features.py): refused, with the flags named.
            why = node.state.features.refusal(
                None if not isinstance(f.features, list)
                else frozenset(x for x in f.features if isinstance(x, str))
            )
            if why is not None:
                raise AccessRefused(f"the joining broker cannot be served: {why}")
            cap = await update.capture(node, f.since, f.queues, f.state)
        except AccessRefused as exc:
            log.warning("refused a join update to %s: %s", conn.peer, exc.message)
            self._refused("member")
            conn.error(f.corr, exc)
            return
        except BatonError as exc:
            conn.error(f.corr, exc)
            return
        sent = queues = 0
        rate = self._rate
        began = time.monotonic()
        try:
            log.info("serving a join update to %s from log offset %d", conn.peer, cap.applied)
            self._send_big(wire.UpdateState(f.corr, cap.applied, cap.snapshot))
            async for frame in update.update_frames(cap, f.corr, live=node.queues.get):
                self._send_big(frame)
                if isinstance(frame, wire.UpdateFront):
                    sent += len(frame.entries)
                    await asyncio.sleep(0)  # flush; let clients in between chunks
                    # A joiner that stops reading must not hold this capture (and
                    # the log's retention) forever.
                    await asyncio.wait_for(conn.drained(), 30)
                    if rate:  # the operator's cap on what an update may take
                        ahead = sent / rate - (time.monotonic() - began)
                        if ahead > 0:
                            await asyncio.sleep(ahead)
                elif type(frame) is wire.UpdateDone:
                    queues += 1
                if conn.closed:
                    return
            conn.send(wire.ok(f.corr, UpdateSent(cap.applied, queues, sent)))
            log.info("join update to %s done: %d queues, %d messages", conn.peer, queues, sent)
        except asyncio.CancelledError:
            log.info("join update to %s ended by the joiner after %d messages", conn.peer, sent)
        except TimeoutError:
            log.warning("join update to %s abandoned: the joiner stopped reading", conn.peer)
            conn.close()
        finally:
            cap.close()

    def _send_big(self, frame: wire.Frame) -> None:
        self._conn.send(frame, self._big)
