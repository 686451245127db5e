"""Peer links (forwarding between brokers, docs/design.md §16, docs/protocol.md
"Broker to broker: forwarding"), refused: real brokers, raw frames. A plain client may not
open one; a MEMBER session must prove its key before it submits; a runtime outside
control's view (with or without a Join on the log) and a member that signs with another
key are refused with AccessRefused, logged, and get nothing appended."""

from __future__ import annotations

import time
from pathlib import Path

from batonmq.clients import wire
from batonmq.cluster.events import DeclareQueue
from batonmq.broker.peers import encode_event
from batonmq.cluster.member_proof import PEER, MemberKey
from tests.helpers import eventually_sync, topology
from tests.integration.conftest import BrokerProcess
from tests.integration.test_bad_clients import RawClient
from tests.integration.test_member_proof import append_join, member_session, refused


async def test_a_peer_link_is_refused_to_anyone_but_a_proven_member(
    cluster: list[BrokerProcess], tmp_path: Path
) -> None:
    server = cluster[0]
    submit = encode_event(DeclareQueue("stolen"))

    # A plain client may not prove or submit.
    raw = RawClient(server.address)
    try:
        refused(raw, wire.PeerProof(raw.next_corr(), "node-2/x", b"\x00" * 64),
                "only a cluster member")
        refused(raw, wire.Submit(raw.next_corr(), 1, submit), "only a cluster member")
    finally:
        raw.close()

    key = MemberKey()
    with member_session(server.address, "ghost/r0") as (raw, nonce, node_id):
        # Nothing is submitted before the link's proof.
        refused(raw, wire.Submit(raw.next_corr(), 1, submit), "PeerProof before Submit")
        # A runtime that is no member (waited for a moment: a new member's view and key
        # may be on their way).
        began = time.monotonic()
        refused(raw, wire.PeerProof(raw.next_corr(), "ghost/r0", key.prove(nonce, node_id, PEER)),
                "not a member of the cluster's view")
        assert time.monotonic() - began >= 4

    # A runtime whose Join (and key) is on the log, but which is in no view.
    await append_join(tmp_path / "shared-log", "intruder", "r1", key)
    with member_session(server.address, "intruder/r1") as (raw, nonce, node_id):
        refused(raw, wire.PeerProof(raw.next_corr(), "intruder/r1",
                                    key.prove(nonce, node_id, PEER)),
                "not a member of the cluster's view")

    # A member of the view (node-2 joined by an update: its key is recorded), but the
    # proof is not made with its key; then one for another server.
    top = await topology(server.address)
    member = next(f"{i['node_id']}/{i['runtime']}" for i in top["instances"]
                  if i["node_id"] == "node-2")
    with member_session(server.address, member) as (raw, nonce, node_id):
        began = time.monotonic()
        refused(raw, wire.PeerProof(raw.next_corr(), member, key.prove(nonce, node_id, PEER)),
                "does not verify")
        assert time.monotonic() - began < 2  # nothing to wait for
        refused(raw, wire.PeerProof(raw.next_corr(), "node-3/x", key.prove(nonce, node_id, PEER)),
                "its Hello said")
        refused(raw, wire.Submit(raw.next_corr(), 1, submit), "PeerProof before Submit")

    eventually_sync(
        lambda: server.log_path.read_text().count("refused a peer link from 127.0.0.1:") >= 4,
        "the refusals in the server's log",
    )
    raw = RawClient(server.address)
    try:
        raw.send(wire.QueueStats(raw.next_corr(), "stolen"))
        answer = raw.read()
        assert isinstance(answer, wire.Error), answer  # nothing was declared
    finally:
        raw.close()
    assert "Traceback" not in server.output()
