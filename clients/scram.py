"""SCRAM (RFC 5802) with SHA-256 and scrypt: the password check of a Baton connection.

Sans-IO: the client side (:class:`ClientExchange`) and the broker side
(:class:`ServerExchange`) turn the other side's message into the next one; the frames
that carry them are ``Hello``, ``AuthChallenge``, ``AuthResponse`` and ``HelloOk``
(docs/protocol.md, "Authentication").

The messages and the proofs are RFC 5802's (as RFC 7677's SCRAM-SHA-256), with one
change: the salted password is scrypt's (``cryptography``'s Scrypt, N = ``i``, r = 8,
p = 1) instead of PBKDF2's, so what the log keeps of a password (:class:`Credentials`:
salt, cost, StoredKey, ServerKey) is a memory-hard hash. Hence the mechanism's own
name, :data:`MECHANISM`. The password never crosses the wire, and the broker checks a
proof with a few HMACs: a flood of logins costs the broker little (the scrypt work is
the client's). Channel binding is not used (``c=biws``); TLS protects the channel.

(A library was considered: ``scramp`` implements SCRAM with PBKDF2 only.)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from batonmq.cluster.errors import AccessRefused, InvalidArgument

__all__ = [
    "MECHANISM",
    "DEFAULT_USER",
    "DEFAULT_COST",
    "Credentials",
    "make_credentials",
    "check_password",
    "ClientExchange",
    "ServerExchange",
]

#: The user a client that names none logs in as (password ``guest`` too).
DEFAULT_USER = "guest"
#: The mechanism's name in ``Hello.auth``.
MECHANISM = "SCRAM-SHA-256-SCRYPT"
#: scrypt's N for new credentials (2^14, r = 8: 16 MiB and about a tenth of a second, once per
#: connection, on the client).
DEFAULT_COST = 1 << 14
#: The costs a broker accepts in credentials (and a client in a challenge): a client
#: must not be made to spend unbounded memory by a broker it does not trust yet.
MIN_COST, MAX_COST = 1 << 10, 1 << 20
_NONCE_BYTES = 18


@dataclass(frozen=True, slots=True)
class Credentials:
    """What is kept of a password: never the password, nor anything that logs in
    by itself (StoredKey is a hash of the key a client proves it has)."""

    salt: bytes
    cost: int
    stored_key: bytes
    server_key: bytes

    def __post_init__(self) -> None:
        if not (MIN_COST <= self.cost <= MAX_COST and self.cost & (self.cost - 1) == 0):
            raise InvalidArgument(
                f"scrypt cost must be a power of two in {MIN_COST}..{MAX_COST}, not {self.cost}"
            )
        if len(self.stored_key) != 32 or len(self.server_key) != 32 or not 8 <= len(self.salt) <= 64:
            raise InvalidArgument("malformed credentials (key or salt length)")


def _salted(password: str, salt: bytes, cost: int) -> bytes:
    return Scrypt(salt=salt, length=32, n=cost, r=8, p=1).derive(password.encode("utf-8"))


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def _keys(salted: bytes) -> tuple[bytes, bytes, bytes]:
    """(ClientKey, StoredKey, ServerKey) of a salted password."""
    client_key = _hmac(salted, b"Client Key")
    return client_key, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key")


def make_credentials(
    password: str, *, salt: bytes | None = None, cost: int = DEFAULT_COST
) -> Credentials:
    """The credentials to keep for ``password`` (a new random salt unless given)."""
    if not password:
        raise InvalidArgument("a password must not be empty")
    salt = os.urandom(16) if salt is None else salt
    _, stored, server = _keys(_salted(password, salt, cost))
    return Credentials(salt, cost, stored, server)


def check_password(creds: Credentials, password: str) -> bool:
    """Whether ``password`` is the one ``creds`` were made from (for a plain password
    over TLS: the broker then does the scrypt work)."""
    _, stored, _ = _keys(_salted(password, creds.salt, creds.cost))
    return hmac.compare_digest(stored, creds.stored_key)


def _escape(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


def _fields(message: bytes, what: str) -> dict[str, str]:
    """The ``k=v`` attributes of a SCRAM message (bad input: AccessRefused)."""
    try:
        text = message.decode("utf-8")
        out: dict[str, str] = {}
        for part in text.split(","):
            k, sep, v = part.partition("=")
            if not sep or len(k) != 1:
                raise ValueError(part)
            out.setdefault(k, v)
        return out
    except (UnicodeDecodeError, ValueError):
        raise AccessRefused(f"malformed SCRAM {what} message") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise AccessRefused(f"malformed base64 in the SCRAM {what}") from None


class ClientExchange:
    """The client's side: :meth:`first`, then :meth:`final` on the broker's challenge,
    then :meth:`verify` on the broker's last message (which proves the broker knows
    the credentials too, so a client is not fooled by a broker that does not)."""

    def __init__(self, user: str, password: str, nonce: str | None = None) -> None:
        self.user = user
        self._password = password
        self._nonce = nonce or _b64(os.urandom(_NONCE_BYTES))
        self._bare = f"n={_escape(user)},r={self._nonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        """client-first-message (no channel binding)."""
        return ("n,," + self._bare).encode("utf-8")

    def final(self, server_first: bytes) -> bytes:
        """client-final-message for the broker's server-first-message.

        Raises:
            AccessRefused: the challenge is malformed, does not extend our nonce, or
                asks for a cost out of bounds.
        """
        f = _fields(server_first, "challenge")
        nonce, salt = f.get("r", ""), _unb64(f.get("s", ""), "challenge")
        try:
            cost = int(f.get("i", ""))
        except ValueError:
            raise AccessRefused("malformed SCRAM challenge (cost)") from None
        if not nonce.startswith(self._nonce) or len(nonce) <= len(self._nonce):
            raise AccessRefused("the broker's SCRAM nonce does not extend ours")
        if not (MIN_COST <= cost <= MAX_COST) or not salt:
            raise AccessRefused(f"the broker asks for a scrypt cost out of bounds ({cost})")
        salted = _salted(self._password, salt, cost)
        client_key, stored, server_key = _keys(salted)
        without_proof = f"c=biws,r={nonce}"
        auth = f"{self._bare},{server_first.decode('utf-8')},{without_proof}".encode("utf-8")
        signature = _hmac(stored, auth)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = _hmac(server_key, auth)
        return f"{without_proof},p={_b64(proof)}".encode("utf-8")

    def verify(self, server_final: bytes) -> None:
        """Check the broker's server-final-message.

        Raises:
            AccessRefused: the broker does not know the credentials (or said ``e=``).
        """
        f = _fields(server_final, "outcome")
        if "e" in f:
            raise AccessRefused(f"authentication failed: {f['e']}")
        got = _unb64(f.get("v", ""), "outcome")
        if not self._server_signature or not hmac.compare_digest(got, self._server_signature):
            raise AccessRefused("the broker could not prove that it knows this user's credentials")


class ServerExchange:
    """The broker's side: :meth:`first` on the client-first-message, then :meth:`final`
    on the client-final-message. An unknown user gets a challenge like any other (a
    salt derived from ``secret`` and the name), so a login does not tell which users
    exist; it fails at :meth:`final` like a wrong password.

    Args:
        lookup: the user's credentials by name (None: no such user).
        secret: this broker's random secret for the unknown users' salts.
    """

    def __init__(self, lookup: Callable[[str], Credentials | None], secret: bytes) -> None:
        self._lookup = lookup
        self._secret = secret
        self.user = ""
        self._creds: Credentials | None = None
        self._auth_prefix = ""
        self._nonce = ""

    def first(self, client_first: bytes) -> bytes:
        """server-first-message for the client-first-message.

        Raises:
            AccessRefused: the message is malformed or asks for channel binding.
        """
        text = client_first.decode("utf-8", "replace")
        if not text.startswith("n,,"):
            raise AccessRefused("SCRAM without channel binding expected (gs2 header 'n,,')")
        bare = text[3:]
        f = _fields(bare.encode("utf-8"), "first")
        self.user, client_nonce = _unescape(f.get("n", "")), f.get("r", "")
        if not self.user or not client_nonce or "m" in f:
            raise AccessRefused("malformed SCRAM first message (user or nonce)")
        self._creds = self._lookup(self.user)
        if self._creds is not None:
            salt, cost = self._creds.salt, self._creds.cost
        else:
            salt = _hmac(self._secret, self.user.encode("utf-8"))[:16]
            cost = DEFAULT_COST
        self._nonce = client_nonce + _b64(os.urandom(_NONCE_BYTES))
        server_first = f"r={self._nonce},s={_b64(salt)},i={cost}"
        self._auth_prefix = f"{bare},{server_first}"
        return server_first.encode("utf-8")

    def final(self, client_final: bytes) -> bytes:
        """server-final-message once the client's proof checks.

        Raises:
            AccessRefused: unknown user, wrong password, or a malformed message (the
                same message for the first two).
        """
        f = _fields(client_final, "final")
        if f.get("r") != self._nonce or f.get("c") != "biws" or not self._auth_prefix:
            raise AccessRefused("malformed SCRAM final message (nonce or channel binding)")
        without_proof = client_final.decode("utf-8").rsplit(",p=", 1)[0]
        proof = _unb64(f.get("p", ""), "final")
        creds = self._creds
        if creds is None or len(proof) != 32:
            raise AccessRefused(f"wrong user name or password for {self.user!r}")
        auth = f"{self._auth_prefix},{without_proof}".encode("utf-8")
        signature = _hmac(creds.stored_key, auth)
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), creds.stored_key):
            raise AccessRefused(f"wrong user name or password for {self.user!r}")
        return f"v={_b64(_hmac(creds.server_key, auth))}".encode("utf-8")
