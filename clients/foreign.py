"""Another protocol where Baton's is expected: recognised by its first bytes, so that
a client pointed at the wrong port, or a foreign client at a Baton port, is told what
it reached instead of a nonsense frame length (docs/protocol.md, "Wrong port")."""

from __future__ import annotations

from typing import Final

__all__ = ["foreign_protocol", "client_hint", "HTTP_REPLY"]

_HTTP_METHODS: Final = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ")

#: What the native listener answers an HTTP request with before closing.
HTTP_REPLY: Final = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n"
    b"This is a Baton broker's client port (Baton's own protocol), not HTTP: the admin API"
    b" and the console are on the port of --admin-listen.\n"
)


def foreign_protocol(prefix: bytes) -> str | None:
    """The protocol whose first bytes ``prefix`` are, if not Baton's: ``"HTTP"`` (a
    request or a response), ``"AMQP"`` (0-9-1's protocol header, or a server's answer
    with one), ``"TLS"``; None when it may be a Baton frame."""
    if prefix.startswith(b"AMQP"):
        return "AMQP"
    if prefix.startswith(b"HTTP/") or prefix.startswith(_HTTP_METHODS):
        return "HTTP"
    if prefix[:1] in (b"\x15", b"\x16") and prefix[1:2] == b"\x03":
        return "TLS"
    return None


def client_hint(protocol: str) -> str:
    """What a Baton client tells its user when the broker's address answered in
    ``protocol`` (HTTP or AMQP)."""
    if protocol == "HTTP":
        return (
            "this port speaks HTTP (the admin listener, --admin-listen?), not Baton's"
            " protocol: give the broker's client port (--listen, default 5671)"
        )
    return (
        "this port speaks AMQP 0-9-1 (the --amqp-listen port, for pika and other AMQP"
        " clients), not Baton's protocol: give the broker's client port (--listen,"
        " default 5671)"
    )
