"""The member proof (cluster/member_proof.py): a signature of a member's challenge by the key
of the joiner's Join, checked against the join keys the log recorded."""

from __future__ import annotations

import pytest

from batonmq.cluster.errors import AccessRefused
from batonmq.cluster.member_proof import NONCE_BYTES, MemberKey, check, new_nonce, verify


def test_a_proof_verifies_only_for_its_key_nonce_and_member() -> None:
    key, other = MemberKey(), MemberKey()
    assert len(key.public) == 32 and key.public != other.public
    nonce = new_nonce()
    assert len(nonce) == NONCE_BYTES and nonce != new_nonce()
    proof = key.prove(nonce, "node-1")
    assert verify(key.public, nonce, "node-1", proof)
    assert not verify(other.public, nonce, "node-1", proof)  # another key
    assert not verify(key.public, new_nonce(), "node-1", proof)  # another connection
    assert not verify(key.public, nonce, "node-2", proof)  # another member
    assert not verify(key.public, nonce, "node-1", proof[:-1] + bytes([proof[-1] ^ 1]))
    assert not verify(b"short", nonce, "node-1", proof)  # not a key at all
    assert key.public.hex() in repr(key)


def test_check_says_why_a_request_is_refused() -> None:
    key = MemberKey()
    nonce = new_nonce()
    keys = {"n3/r3": key.public}
    good = key.prove(nonce, "n1")
    check(keys, ("n3/r3", nonce), "n3/r3", good, "n1")  # served
    cases = [
        (None, "n3/r3", good, "MEMBER"),  # not a member session
        (("n3/r3", nonce), "n4/r4", good, "its Hello said"),
        (("n4/r4", nonce), "n4/r4", good, "no Join"),
        (("n3/r3", nonce), "n3/r3", MemberKey().prove(nonce, "n1"), "does not verify"),
        (("n3/r3", nonce), "n3/r3", b"", "does not verify"),
    ]
    for session, member, proof, why in cases:
        with pytest.raises(AccessRefused, match=why):
            check(keys, session, member, proof, "n1")
