"""A joining broker proves it is the runtime that appended its Join (docs/design.md §8,
docs/security.md "Member proof").

A join update streams every message of every queue, so a member serves it only to a peer
that proves who it is, by a challenge, never by a secret on the wire:

1. Each broker runtime makes an Ed25519 key pair when it starts (:class:`MemberKey`); the
   private key never leaves the process. Its public key goes on the log in the runtime's
   ``Join`` (``Join.member_key``), and every replica records it
   (``Membership.join_keys``).
2. The joiner says ``Hello`` with ``auth={"mechanism": "MEMBER", "member": "node/runtime"}``;
   the member answers ``HelloOk`` with ``auth={"nonce": <32 fresh random bytes>}``.
3. The joiner's ``UpdateRequest`` carries ``member`` and ``proof``, its signature of
   ``b"baton-update\\0" + nonce + donor_node_id``. The member, once it has applied the
   log up to the request's ``since`` (so up to the Join), serves it only if the proof
   verifies against the key the log recorded for that runtime (:func:`check`).

So whoever can append to the log can join (with a sealed log: only the holders of its
key), and nobody else; the proof cannot be replayed on another connection (a fresh
nonce each) or to another member (its node id is signed).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from batonmq.cluster.errors import AccessRefused

__all__ = [
    "MECHANISM", "NONCE_BYTES", "UPDATE", "PEER", "MemberKey", "new_nonce", "verify", "check",
    "check_peer",
]

#: ``Hello.auth["mechanism"]`` of a joining broker's connection.
MECHANISM = "MEMBER"
#: The size of a member challenge.
NONCE_BYTES = 32
#: What a proof is for, signed with it: a join update's proof is no peer link's, and the
#: other way round.
UPDATE = b"baton-update\0"
#: A peer link's proof (forwarding between brokers, broker/peers.py).
PEER = b"baton-peer\0"


def _signed(nonce: bytes, donor: str, context: bytes) -> bytes:
    """What a proof signs: the nonce has a fixed size, so the parts cannot be shifted."""
    return context + nonce + donor.encode()


def new_nonce() -> bytes:
    """A fresh challenge for one member session."""
    return secrets.token_bytes(NONCE_BYTES)


class MemberKey:
    """One runtime's key pair: the public key goes on the log, the private key signs
    challenges and never leaves this object."""

    __slots__ = ("_private", "public")

    def __init__(self) -> None:
        self._private = Ed25519PrivateKey.generate()
        #: The raw 32-byte public key (``Join.member_key``).
        self.public: bytes = self._private.public_key().public_bytes(
            Encoding.Raw, PublicFormat.Raw
        )

    def prove(self, nonce: bytes, donor: str, context: bytes = UPDATE) -> bytes:
        """The proof for the challenge ``nonce`` of the member whose node id is ``donor``
        (``context``: what it is for, :data:`UPDATE` or :data:`PEER`)."""
        return self._private.sign(_signed(nonce, donor, context))

    def __repr__(self) -> str:
        return f"MemberKey(public={self.public.hex()})"


def verify(
    public: bytes, nonce: bytes, donor: str, proof: bytes, context: bytes = UPDATE
) -> bool:
    """Whether ``proof`` is the signature of the challenge by the key ``public``."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(
            proof, _signed(nonce, donor, context)
        )
    except (InvalidSignature, ValueError):
        return False
    return True


def check(
    join_keys: Mapping[str, bytes],
    session: tuple[str, bytes] | None,
    member: str,
    proof: bytes,
    donor: str,
) -> None:
    """Check a join update request's member proof.

    Args:
        join_keys: the join keys this member has applied (``Membership.join_keys``).
        session: the member session's (member, nonce) from its MEMBER Hello; None: the
            connection did not say MEMBER.
        member: ``UpdateRequest.member``.
        proof: ``UpdateRequest.proof``.
        donor: this broker's node id.

    Raises:
        AccessRefused: why the request is not served.
    """
    if session is None:
        raise AccessRefused(
            "a join update is served only to a joining broker: say Hello with the"
            f" {MECHANISM} mechanism and prove the key of its Join"
        )
    said, nonce = session
    if member != said:
        raise AccessRefused(
            f"the update request names member {member!r}, its Hello said {said!r}"
        )
    public = join_keys.get(member)
    if public is None:
        raise AccessRefused(
            f"no Join with a member key of {member!r} is on the log as applied here (not a"
            " joining broker runtime, one that left, or an older broker without member keys)"
        )
    if not verify(public, nonce, donor, proof):
        raise AccessRefused(
            f"the member proof of {member!r} does not verify against the key of its Join"
        )


def check_peer(
    join_keys: Mapping[str, bytes],
    members: Collection[str],
    session: tuple[str, bytes],
    member: str,
    proof: bytes,
    server: str,
) -> None:
    """Check a peer link's member proof (forwarding between brokers, broker/peers.py):
    the runtime must be a member of the view and prove the key its Join recorded.

    Args:
        join_keys: the join keys applied on the control partition.
        members: the control partition's view as applied here.
        session: the link's (member, nonce) from its MEMBER Hello.
        member: the runtime the proof is for.
        proof: its signature of the challenge, for :data:`PEER`.
        server: this broker's node id.

    Raises:
        AccessRefused: why the link is not served.
    """
    said, nonce = session
    if member != said:
        raise AccessRefused(f"the peer proof names member {member!r}, its Hello said {said!r}")
    if member not in members:
        raise AccessRefused(
            f"{member!r} is not a member of the cluster's view as applied here: forwarded"
            " commands are served to members only"
        )
    public = join_keys.get(member)
    if public is None:
        raise AccessRefused(
            f"no member key of {member!r} is on the log as applied here (it has not"
            " recorded its key yet, or is of a build without member keys)"
        )
    if not verify(public, nonce, server, proof, PEER):
        raise AccessRefused(
            f"the member proof of {member!r} does not verify against the key of its Join"
        )
