"""Allow-lists of networks: who may connect to a broker's listeners at all
(docs/security.md, "Networks").

``--allow-from CIDR,...`` limits the client port (clients, and the brokers that join by
it; an observer's reads too); ``--admin-allow-from`` the admin HTTP listener, loopback by
default. A peer outside the list is refused before it can send anything that is read.
"""

from __future__ import annotations

import ipaddress
from typing import Final, TypeAlias

from batonmq.cluster.errors import InvalidArgument

__all__ = ["LOOPBACK", "Networks", "parse_networks", "allows", "describe"]

Networks: TypeAlias = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]

#: The loopback networks, IPv4 and IPv6.
LOOPBACK: Final[Networks] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)


def parse_networks(text: str) -> Networks:
    """``"10.0.0.0/8, 192.168.1.7, ::1"`` as networks (an address alone is one host;
    ``loopback`` names both loopback networks).

    Raises:
        InvalidArgument: an entry that is not an address or a network, or none at all.
    """
    out: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part == "loopback":
            out.extend(LOOPBACK)
            continue
        try:
            out.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise InvalidArgument(
                f"{part!r} is not a network (CIDR such as 10.0.0.0/8) or an IP address"
            ) from None
    if not out:
        raise InvalidArgument("no network given (e.g. 10.0.0.0/8,loopback)")
    return tuple(out)


def allows(networks: Networks | None, peer_host: str) -> bool:
    """Whether ``peer_host`` (an IP address; an IPv4-mapped IPv6 one is read as IPv4)
    is in one of ``networks`` (None: every peer is)."""
    if networks is None:
        return True
    try:
        address = ipaddress.ip_address(peer_host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address.version == n.version and address in n for n in networks)


def describe(networks: Networks) -> str:
    """The networks for a message ("loopback peers" for :data:`LOOPBACK`)."""
    if networks == LOOPBACK:
        return "loopback peers"
    return ", ".join(str(n) for n in networks)
