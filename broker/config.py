"""Broker settings, with the defaults a single-host user wants."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from batonmq.cluster.errors import InvalidArgument

__all__ = [
    "BrokerConfig",
    "parse_address",
    "ready_address",
    "admin_ready_address",
    "DEFAULT_PORT",
    "READY_PREFIX",
    "ADMIN_READY_PREFIX",
]

DEFAULT_PORT = 5671


def parse_address(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """Parse ``HOST:PORT`` (or ``:PORT``, or ``PORT``).

    Raises:
        InvalidArgument: not a valid address.
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = default_host, text
    try:
        number = int(port)
    except ValueError:
        raise InvalidArgument(f"bad address {text!r}: port must be a number") from None
    if not 0 <= number <= 65535:
        raise InvalidArgument(f"bad address {text!r}: port out of range")
    return (host or default_host).strip("[]"), number


#: How ``baton serve``'s one machine-readable line starts once it serves:
#: ``baton ready: listening on HOST:PORT node NODE_ID``, with the port it bound
#: (the one it got when told ``--listen HOST:0``).
READY_PREFIX = "baton ready: listening on "


def ready_address(line: str) -> str | None:
    """The ``HOST:PORT`` of a ``baton serve`` ready line, or None for any other line."""
    if not line.startswith(READY_PREFIX):
        return None
    rest = line[len(READY_PREFIX):].split()
    return rest[0] if rest else None


#: The line ``baton serve --admin-listen`` prints just before its ready line:
#: ``baton admin ready: listening on HOST:PORT``, with the port it bound.
ADMIN_READY_PREFIX = "baton admin ready: listening on "


def admin_ready_address(line: str) -> str | None:
    """The admin listener's ``HOST:PORT`` of a ``baton serve`` admin line, or None."""
    if not line.startswith(ADMIN_READY_PREFIX):
        return None
    rest = line[len(ADMIN_READY_PREFIX):].split()
    return rest[0] if rest else None


@dataclass(slots=True)
class BrokerConfig:
    """Everything ``baton serve`` can be told.

    Attributes:
        host, port: where clients connect (port 0 picks a free port).
        data_dir: the broker's own directory (store, identity, default log).
        log_url: the ordered log; default ``file:<data_dir>/log``.
        node_id: persistent id; default made at first start and kept in the store.
        max_message: largest message body accepted, bytes.
        max_headers: largest message headers accepted (msgpack-encoded), bytes.
        max_frame: largest wire frame, bytes.
        max_prefetch: largest prefetch a consumer may ask for.
        expiry_interval: seconds between TTL checks of queues with a message TTL.
        role: "voter" (votes, may lead) or "observer" (replicates and serves only).
        properties: instance properties shown in the topology (e.g. zone=a).
        heartbeat_ms: heartbeat interval; a member is suspected after
            ``suspect_beats`` beats of another member without its own (~3 s).
        time_slice_ms: how long an owner keeps a queue others want (docs/design.md §6).
        checkpoint_ms: how often the leader checkpoints: a cross-replica digest
            check, and the log truncated below the checkpoint before (0: never,
            the log grows forever).
        join: how a broker with an empty data dir starts on a log others use:
            "auto" (state from a live member, docs/design.md §8; replay if none and the log
            is whole), "update" or "replay".
        update_max_rate: messages/s this broker streams to a joining broker at most
            (0: as fast as the joiner takes them).
        services: services this broker itself runs for leader of (docs/design.md §7).
        admin_host, admin_port: where the admin HTTP listener listens (docs/admin.md);
            None: no admin listener (the default). Port 0 picks a free port.
    """

    data_dir: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    log_url: str | None = None
    node_id: str | None = None
    max_message: int = 8 * 1024 * 1024
    max_headers: int = 64 * 1024
    max_frame: int = 32 * 1024 * 1024
    max_prefetch: int = 10_000
    expiry_interval: float = 0.25
    role: str = "voter"
    properties: dict[str, str] = field(default_factory=dict)
    heartbeat_ms: int = 500
    suspect_beats: int = 6
    time_slice_ms: int = 200
    checkpoint_ms: int = 5000
    join: str = "auto"
    update_max_rate: int = 0
    services: list[str] = field(default_factory=list)
    admin_host: str | None = None
    admin_port: int = 0

    def resolved_log_url(self) -> str:
        return self.log_url or f"file:{os.path.join(self.data_dir, 'log')}"

    def validate(self) -> None:
        """Raises InvalidArgument on inconsistent settings."""
        if self.max_message > self.max_frame // 2:
            raise InvalidArgument("max_message must be at most half of max_frame")
        if self.max_prefetch < 1:
            raise InvalidArgument("max_prefetch must be at least 1")
        if self.role not in ("voter", "observer"):
            raise InvalidArgument("role must be 'voter' or 'observer'")
        if self.heartbeat_ms < 10 or self.suspect_beats < 2 or self.time_slice_ms < 10:
            raise InvalidArgument("heartbeat_ms, time_slice_ms >= 10 and suspect_beats >= 2")
        if self.checkpoint_ms < 0:
            raise InvalidArgument("checkpoint_ms must be >= 0 (0: no checkpoints)")
        if self.update_max_rate < 0:
            raise InvalidArgument("update_max_rate must be >= 0 (0: no limit)")
        if self.join not in ("auto", "update", "replay"):
            raise InvalidArgument("join must be 'auto', 'update' or 'replay'")
        for name in self.services:
            if not name or len(name) > 255 or not name.isprintable():
                raise InvalidArgument(f"service name {name!r} must be 1..255 printable characters")
