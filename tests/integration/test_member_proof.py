"""A join update is served only to a proven member (docs/protocol.md "Member proof",
docs/security.md): real brokers, raw frames. A plain client, a runtime without a Join on
the log, a wrong signature, a replayed proof or one made for another member are refused
with AccessRefused and get nothing of the state; whoever signs with the key of a Join on
the log gets the update; and brokers still join a live cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from batonmq.clients import wire
from batonmq.cluster.features import FEATURES
from batonmq.cluster import codec
from batonmq.cluster.errors import AccessRefused
from batonmq.cluster.events import Join, Origin
from batonmq.cluster.log import open_log
from batonmq.cluster.member_proof import MemberKey
from tests.helpers import equal_digests, eventually_sync, topology
from tests.integration.conftest import BrokerProcess
from tests.integration.test_bad_clients import RawClient


@contextmanager
def member_session(address: str, member: str) -> Iterator[tuple[RawClient, bytes, str]]:
    """A raw connection that said Hello MEMBER as ``member``: (it, its nonce, the
    member's node id)."""
    raw = RawClient(address, hello=False)
    try:
        raw.send(wire.Hello(
            raw.next_corr(), wire.PROTOCOL_VERSION, "test-member",
            {"mechanism": "MEMBER", "member": member},
        ))
        ok = raw.read()
        assert isinstance(ok, wire.HelloOk), ok
        nonce = ok.auth.get("nonce")
        assert isinstance(nonce, bytes) and len(nonce) == 32, ok.auth
        yield raw, nonce, ok.node_id
    finally:
        raw.close()


def refused(raw: RawClient, request: wire.Frame, why: str) -> None:
    """``request`` is answered with AccessRefused saying ``why``, and nothing else is sent:
    the next answer on the connection is the Ping's."""
    raw.send(request)
    answer = raw.read()
    assert isinstance(answer, wire.Error), answer
    assert answer.code == AccessRefused.code and why in answer.message, answer
    assert answer.corr == getattr(request, "corr")
    assert isinstance(raw.ping(), wire.Ok)  # no UpdateState came before it


async def append_join(log_path: Path, node: str, runtime: str, key: MemberKey) -> int:
    """Append a Join for ``node/runtime`` with ``key``'s public key, as a joining broker
    does; returns its offset."""
    log = await open_log(f"file:{log_path}")
    try:
        record = codec.encode(
            Origin(node, runtime, 1, int(time.time() * 1000)), Join("", key.public)
        )
        return await log.append([record])
    finally:
        await log.close()


async def test_a_join_update_is_served_only_to_a_proven_member(
    cluster: list[BrokerProcess], tmp_path: Path
) -> None:
    donor = cluster[0]
    # node-2 and node-3 started on node-1's log with empty stores: they joined by an
    # update, proving their keys.
    for b in cluster[1:]:
        top = await topology(b.address)
        assert top["join"] is not None and "seconds" in top["join"], top["join"]

    # A plain client (Hello without MEMBER) asks for the update.
    raw = RawClient(donor.address)
    try:
        refused(raw, wire.UpdateRequest(raw.next_corr(), 0, None, True), "MEMBER")
    finally:
        raw.close()

    # A member session of a runtime that never put a Join on the log.
    key = MemberKey()
    with member_session(donor.address, "ghost/r0") as (raw, nonce, node_id):
        assert node_id == "node-1"
        proof = key.prove(nonce, node_id)
        refused(raw, wire.UpdateRequest(raw.next_corr(), 0, None, True, "ghost/r0", proof), "no Join")
        # A member session is for the update only.
        refused(raw, wire.DeclareQueue(raw.next_corr(), "stolen", {}), "member session")

    # A runtime whose Join (with its key) is on the log: only the holder of that key
    # gets the update, and only with a proof for this connection and this member.
    since = await append_join(tmp_path / "shared-log", "intruder", "r1", key)
    member = "intruder/r1"
    with member_session(donor.address, member) as (raw, nonce, node_id):
        wrong_key = MemberKey().prove(nonce, node_id)
        refused(raw, wire.UpdateRequest(raw.next_corr(), since, None, True, member, wrong_key),
                "does not verify")
        other_member = key.prove(nonce, "node-2")
        refused(raw, wire.UpdateRequest(raw.next_corr(), since, None, True, member, other_member),
                "does not verify")
        refused(raw, wire.UpdateRequest(raw.next_corr(), since, None, True, "node-2/x",
                                        key.prove(nonce, node_id)), "its Hello said")
        old_proof = key.prove(nonce, node_id)
    with member_session(donor.address, member) as (raw, nonce, node_id):
        refused(raw, wire.UpdateRequest(raw.next_corr(), since, None, True, member, old_proof),
                "does not verify")  # replayed on another connection: another nonce
        proof = key.prove(nonce, node_id)
        # A joiner that lists no feature flags (a build from before them) is refused: this
        # cluster enabled every flag at its start.
        refused(raw, wire.UpdateRequest(raw.next_corr(), since, None, True, member, proof),
                f"feature flag(s) {', '.join(sorted(FEATURES))} enabled")
        corr = raw.next_corr()
        raw.send(wire.UpdateRequest(corr, since, None, True, member, proof, sorted(FEATURES)))
        served = raw.read()
        assert isinstance(served, wire.UpdateState) and served.corr == corr, served
        assert served.applied >= since and served.snapshot is not None

    # A MEMBER Hello that names no member is refused and the connection closed.
    raw = RawClient(donor.address, hello=False)
    try:
        raw.send(wire.Hello(1, wire.PROTOCOL_VERSION, "x", {"mechanism": "MEMBER"}))
        answer = raw.read()
        assert isinstance(answer, wire.Error) and answer.code == AccessRefused.code, answer
        assert answer.corr == 0
    finally:
        raw.close()

    # Each refusal is logged as a warning with the peer's address.
    eventually_sync(
        lambda: donor.log_path.read_text().count("refused a join update to 127.0.0.1:") >= 6,
        "the refusals in the donor's log",
    )
    # Every replica recorded the intruder's key alike.
    await equal_digests(cluster)
