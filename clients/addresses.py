"""Broker addresses: ``"HOST:PORT"`` strings in, ``(host, port)`` pairs out, and back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final
from urllib.parse import unquote

from batonmq.cluster.errors import InvalidArgument

__all__ = ["DEFAULT_PORT", "parse_addresses", "format_address", "split_url"]

#: Port used when an address has no ``:PORT``.
DEFAULT_PORT: Final = 5671


def parse_addresses(addresses: str | Sequence[str]) -> list[tuple[str, int]]:
    """Turn ``"HOST:PORT"`` strings into ``(host, port)`` pairs.

    Args:
        addresses: one address, a comma-separated list, or a sequence of either.
            IPv6 hosts are written in brackets: ``"[::1]:5671"``. A missing port
            means :data:`DEFAULT_PORT`; a bare port (``"5671"``) a broker on this
            host (127.0.0.1).

    Returns:
        The addresses in the order given.

    Raises:
        InvalidArgument: no address, or one that cannot be parsed.
    """
    items = [addresses] if isinstance(addresses, str) else list(addresses)
    out: list[tuple[str, int]] = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidArgument(f"address must be a str, got {type(item).__name__}")
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            host, port = part, DEFAULT_PORT
            if part.isdigit():
                # A bare port: a broker on this host.
                host, port = "127.0.0.1", _parse_port(part, part)
            elif part.startswith("["):
                end = part.find("]")
                if end < 0:
                    raise InvalidArgument(f"bad address {part!r}: missing ']'")
                host, rest = part[1:end], part[end + 1 :]
                if rest:
                    if not rest.startswith(":"):
                        raise InvalidArgument(f"bad address {part!r}")
                    port = _parse_port(part, rest[1:])
            elif part.count(":") == 1:
                host, port_text = part.split(":")
                port = _parse_port(part, port_text)
            elif ":" in part:
                raise InvalidArgument(f"bad address {part!r}: write IPv6 hosts as [HOST]:PORT")
            if not host:
                raise InvalidArgument(f"bad address {part!r}: empty host")
            out.append((host, port))
    if not out:
        raise InvalidArgument("no broker address given")
    return out


def split_url(addresses: str | Sequence[str]) -> tuple[str | Sequence[str], str | None, str | None]:
    """Split ``baton://USER:PASSWORD@HOST:PORT,HOST:PORT`` into the addresses and the
    user and password (percent-decoded); other forms come back as they are, with
    (None, None). ``baton://HOST:PORT`` names no user.

    Raises:
        InvalidArgument: another scheme than ``baton://``.
    """
    if not isinstance(addresses, str) or "://" not in addresses:
        return addresses, None, None
    scheme, _, rest = addresses.partition("://")
    if scheme != "baton":
        raise InvalidArgument(f"unknown address scheme {scheme!r}:// (write baton://...)")
    rest = rest.rstrip("/")
    if "@" not in rest:
        return rest, None, None
    userinfo, _, hosts = rest.rpartition("@")
    user, sep, password = userinfo.partition(":")
    return hosts, unquote(user), unquote(password) if sep else None


def _parse_port(address: str, text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise InvalidArgument(f"bad address {address!r}: port is not a number") from None
    if not 0 < port < 65536:
        raise InvalidArgument(f"bad address {address!r}: port out of range")
    return port


def format_address(host: str, port: int) -> str:
    """``"HOST:PORT"``, with an IPv6 host in brackets (the form :func:`parse_addresses` reads)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
