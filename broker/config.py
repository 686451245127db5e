"""Broker settings, with the defaults a single-host user wants."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from batonmq.broker.networks import parse_networks
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.features import VERSION

__all__ = [
    "ADMIN_READY_PREFIX",
    "BrokerConfig",
    "DEFAULT_PORT",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MAX_IN_FLIGHT",
    "READY_PREFIX",
    "AMQP_READY_PREFIX",
    "admin_ready_address",
    "amqp_ready_address",
    "package_version",
    "parse_address",
    "split_advertise",
    "unspecified",
    "ready_address",
]


def package_version() -> str:
    """The build's version, one number for ``--version`` and ``HelloOk``: the package's
    (a test keeps it equal to pyproject.toml's), so that a broker does not load
    ``importlib.metadata`` and the ``email`` package under it to ask (1.5 MiB of an
    idle broker's RSS)."""
    return VERSION


DEFAULT_PORT = 5671
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
#: Commands one client connection may have in flight before the broker stops reading
#: its frames (the default of ``BrokerConfig.max_in_flight``).
MAX_IN_FLIGHT = 20_000


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


def unspecified(host: str) -> bool:
    """True for the all-interfaces address (``0.0.0.0``, ``::``), which no peer can use."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False  # a name


def split_advertise(text: str, bound_port: int) -> tuple[str, int]:
    """Parse ``--advertise``: ``HOST:PORT``, or ``HOST`` alone (``bound_port`` then).

    Raises:
        InvalidArgument: not a valid address.
    """
    if text.startswith("["):  # [IPv6] or [IPv6]:PORT
        host, port = parse_address(text) if "]:" in text else (text.strip("[]"), bound_port)
    elif text.count(":") == 1:
        host, port = parse_address(text, default_host="")
    else:  # a name, an IPv4 address, or a bare IPv6 address
        host, port = text, bound_port
    if not host:
        raise InvalidArgument(f"bad address {text!r}: no host")
    return host, port


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


def _opt(default: Any = MISSING, *, help: str, factory: Any = MISSING, **meta: Any) -> Any:
    """A :class:`BrokerConfig` field with what ``baton serve`` shows of it: ``help``, and
    optionally ``flag`` (instead of ``--<name>``), ``aliases`` (more flags), ``choices``,
    ``least`` (smallest value), ``secret`` (redacted by ``--print-config``). The flags,
    the ``BATON_*`` variables and the config file keys are all derived from these
    (broker/settings.py), so the three routes cannot drift apart."""
    meta["help"] = help
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)
#: The line ``baton serve --admin-listen`` prints just before its ready line:
#: ``baton admin ready: listening on HOST:PORT``, with the port it bound.
ADMIN_READY_PREFIX = "baton admin ready: listening on "


def admin_ready_address(line: str) -> str | None:
    """The admin listener's ``HOST:PORT`` of a ``baton serve`` admin line, or None."""
    if not line.startswith(ADMIN_READY_PREFIX):
        return None
    rest = line[len(ADMIN_READY_PREFIX):].split()
    return rest[0] if rest else None


#: The line ``baton serve --amqp-listen`` prints just before its ready line:
#: ``baton amqp ready: listening on HOST:PORT``, with the port it bound.
AMQP_READY_PREFIX = "baton amqp ready: listening on "


def amqp_ready_address(line: str) -> str | None:
    """The AMQP listener's ``HOST:PORT`` of a ``baton serve`` AMQP line, or None."""
    if not line.startswith(AMQP_READY_PREFIX):
        return None
    rest = line[len(AMQP_READY_PREFIX):].split()
    return rest[0] if rest else None


@dataclass(slots=True)
class BrokerConfig:
    """Everything ``baton serve`` can be told: one field per option, with its default
    and meaning in the field's metadata (docs/configuration.md is the reference).

    Attributes:
        data_dir: the broker's own directory (store, identity, default log).
        host, port: where clients connect (port 0 picks a free port).
        log_url: the ordered log; default ``file:<data_dir>/log``.
        kafka_password_file: file holding the password a Kafka log logs in with (its
            URL says how: ``security_protocol=SASL_SSL&sasl_mechanism=...&sasl_username=...``);
            the variable ``BATON_KAFKA_PASSWORD`` gives it too. Never in the URL.
        node_id: persistent id; default made at first start and kept in the store.
        max_message: largest message body accepted, bytes.
        max_headers: largest message headers accepted (msgpack-encoded), bytes.
        max_frame: largest wire frame, bytes.
        max_prefetch: largest prefetch a consumer may ask for.
        max_in_flight: commands one connection may have in flight before the broker
            stops reading from it.
        max_append: most events per log append (the appender's batch).
        max_outbox: most events waiting for an unavailable log before commands fail.
        append_linger_us: microseconds the appender waits before taking each batch,
            while that gathers more events (0: never; docs/performance.md "Changes and
            their effect").
        expiry_interval: seconds between TTL checks of queues with a message TTL.
        role: "voter" (votes, may lead) or "observer" (replicates and serves only).
        properties: instance properties shown in the topology (e.g. zone=a).
        heartbeat_ms: heartbeat interval; a member is suspected after
            ``suspect_beats`` beats of another member without its own (~3 s).
        time_slice_ms: how long an owner keeps a queue others want (docs/design.md §6).
        checkpoint_ms: how often the leader checkpoints: a cross-replica digest
            check, and the log truncated below the checkpoint before (0: never,
            the log grows forever).
        partitions: how many data partitions a new cluster's log gets (1: one log;
            N > 1: a control partition and N data partitions, docs/design.md §16); a log
            that exists keeps the partitions it has.
        replicas: each data partition's replica group size on a split log (0: the
            cluster's setting, else 3; capped by the brokers there are);
            recorded by the first broker of a cluster that gives it.
        replace_after_ms: how long a broker may be out of the view before its replica
            groups replace it (a restart within it moves no data).
        join: how a broker with an empty data dir starts on a log others use:
            "auto" (state from a live member, docs/design.md §8; replay if none and the log
            is whole), "update" or "replay".
        update_max_rate: messages/s this broker streams to a joining broker at most
            (0: as fast as the joiner takes them).
        services: services this broker itself runs for leader of (docs/design.md §7).
        tls_cert, tls_key, tls_ca, tls_verify_clients: TLS of the client port and
            of the join update (docs/security.md).
        max_connections, max_consumers, max_connection_prefetch: limits per broker
            and per connection.
        max_unauthenticated, max_unauthenticated_per_host: connections not logged in
            yet (a joining broker's before its member proof), in all and per source
            address (broker/admission.py).
        max_output, output_grace: the bytes queued for a client that does not read,
            and how long it may stay above them before it is closed.
        hello_timeout, idle_timeout: how long a new connection has for Hello, and
            an idle one before it is closed.
        log_level, log_format: the process's logging (docs/operations.md).
        log_key_file: TOML file of the keys that seal the log (docs/log-sealing.md);
            not set: records are plain.
        allow_from: the networks client connections (and joining brokers) may come
            from (``CIDR,...``, ``loopback``); None: anywhere.
        admin_allow_from: the networks the admin listener serves (default loopback).
        admin_password_file: file holding the password of the ``admin`` user made at
            a cluster's first start (instead of ``guest``); the variable
            ``BATON_ADMIN_PASSWORD`` gives it too. Ignored once the cluster has users.
        admin_listen: ``HOST:PORT`` of the admin HTTP listener (docs/admin.md); not
            set: no admin listener (the default). Port 0 picks a free port.
        admin_tls_cert, admin_tls_key: the admin listener's certificate and key (both
            or neither): it serves HTTPS only, and its session cookie is ``Secure``.
        admin_allowed_hosts: the host names the admin listener answers to besides IP
            addresses and ``localhost`` (``NAME`` or ``NAME:PORT``, comma-separated;
            ``*``: any); None: none.
        admin_session_idle: seconds a console session lasts without a request.
        amqp_listen: ``HOST:PORT`` of the AMQP 0-9-1 listener (docs/amqp.md); not set:
            none (the default). Port 0 picks a free port. With tls_cert it speaks TLS
            too, with the client port's certificate.
        amqp_body_buffer, amqp_body_buffer_total: the AMQP message bodies announced by
            their content header and not yet whole, per connection (above: closed) and
            per broker (above: the next body waits); each at least ``max_message``.
    """

    data_dir: str = _opt(help="the broker's own directory: store, identity, default log")
    host: str = _opt("127.0.0.1", help="interface clients connect to")
    port: int = _opt(DEFAULT_PORT, least=0, help="client port (0: a free one, named in the ready line)")
    advertise: str | None = _opt(None,
                                 help="HOST or HOST:PORT that other brokers and clients are"
                                      " told to reach this broker at (not set: the listen"
                                      " address; needed when listening on all interfaces;"
                                      " no port: the bound one)")
    log_url: str | None = _opt(None, aliases=("--log",),
                               help="the ordered log's URL (not set: file:<data_dir>/log)")
    kafka_password_file: str | None = _opt(None,
                                           help="the password a kafka:// log logs in with"
                                                " (SASL; the log URL names the user and the"
                                                " mechanism) is the first line of this file"
                                                " (or BATON_KAFKA_PASSWORD; never in the URL;"
                                                " docs/operations.md)")
    node_id: str | None = _opt(None, help="persistent node id (not set: made at first start)")
    max_message: int = _opt(8 * 1024 * 1024, least=1, help="largest message body accepted, bytes")
    max_headers: int = _opt(64 * 1024, least=1,
                            help="largest message headers accepted (msgpack-encoded), bytes")
    max_frame: int = _opt(32 * 1024 * 1024, least=1024, help="largest wire frame, bytes")
    max_prefetch: int = _opt(10_000, least=1, help="largest prefetch a consumer may ask for")
    max_in_flight: int = _opt(MAX_IN_FLIGHT, least=1,
                              help="commands one connection may have in flight before the"
                                   " broker stops reading from it")
    max_append: int = _opt(2048, least=1, help="most events per log append (the batch)")
    max_outbox: int = _opt(200_000, least=1,
                           help="most events waiting for an unavailable log before commands"
                                " fail with LogUnavailable")
    append_linger_us: int = _opt(3000, least=0,
                                 help="microseconds the appender waits before taking each"
                                      " batch of events for the log, while waiting gathers"
                                      " more (0: never): fewer, larger appends under load,"
                                      " at most that much more latency")
    expiry_interval: float = _opt(0.25, help="seconds between TTL checks of queues with a TTL")
    role: str = _opt("voter", choices=("voter", "observer"),
                     help="observers replicate and serve clients, never vote or lead")
    properties: dict[str, str] = _opt(factory=dict, flag="--property",
                                      help="instance properties for the topology, KEY=VALUE")
    heartbeat_ms: int = _opt(500, least=10, help="heartbeat interval, ms")
    suspect_beats: int = _opt(6, least=2,
                              help="another member's beats without ours before we are suspected")
    time_slice_ms: int = _opt(200, least=10,
                              help="how long an owner keeps a queue other brokers want, ms")
    checkpoint_ms: int = _opt(5000, least=0,
                              help="leader's checkpoint interval: digest check and log"
                                   " truncation, ms (0: off)")
    partitions: int = _opt(1, least=1,
                           help="data partitions of a new cluster's log (1: one log, as"
                                " always; N > 1: a control partition and N data partitions,"
                                " docs/operations.md); an existing log keeps its own")
    replicas: int = _opt(0, least=0,
                         help="brokers in each data partition's replica group on a split log"
                              " (0: the cluster's setting, else 3; capped by the brokers there are);"
                              " recorded once per"
                              " cluster")
    replace_after_ms: int = _opt(30_000, least=0,
                                 help="a broker out of the view this long is replaced in its"
                                      " replica groups, ms")
    join: str = _opt("auto", choices=("auto", "update", "replay"),
                     help="an empty data dir on a busy log: take the state from a live member"
                          " (auto/update) or replay the whole log (replay)")
    update_max_rate: int = _opt(0, least=0,
                                help="messages/s this broker streams to a joining broker at"
                                     " most (0: no cap)")
    services: list[str] = _opt(factory=list, flag="--service",
                               help="services this broker runs for leader of")
    tls_cert: str | None = _opt(None, help="PEM certificate chain of this broker: with tls_key,"
                                          " clients and other brokers connect by TLS only")
    tls_key: str | None = _opt(None, help="PEM private key of tls_cert")
    tls_ca: str | None = _opt(None, help="PEM CA bundle: verifies client certificates"
                                        " (tls_verify_clients) and the broker a joiner takes"
                                        " its update from (not set: the system's CAs)")
    tls_verify_clients: bool = _opt(False, help="accept only clients with a certificate that"
                                               " tls_ca signed")
    max_connections: int = _opt(10_000, least=1,
                                help="client connections this broker keeps open at once; more"
                                     " are refused")
    max_unauthenticated: int = _opt(1_000, least=1,
                                    help="connections (native and AMQP together) that have"
                                         " not logged in yet; more are refused, so they never"
                                         " fill max_connections")
    max_unauthenticated_per_host: int = _opt(100, least=1,
                                             help="connections from one address that have not"
                                                  " logged in yet; more are refused")
    max_consumers: int = _opt(1_000, least=1, help="consumers one connection may have at once")
    max_connection_prefetch: int = _opt(100_000, least=1,
                                        help="sum of the prefetch of one connection's consumers")
    max_output: int = _opt(64 * 1024 * 1024, least=4096,
                           help="bytes queued for a client that does not read its replies;"
                                " above it for output_grace seconds the connection is closed"
                                " (reading it stops well before)")
    output_grace: float = _opt(10.0, help="seconds a connection may stay above max_output")
    hello_timeout: float = _opt(10.0, help="seconds a new connection has to log in (a joining"
                                           " broker: to send its member proof)")
    idle_timeout: float = _opt(0.0, help="close a connection that sent nothing for this many"
                                        " seconds (0: never; the client pings while idle)")
    log_level: str = _opt("INFO", choices=LOG_LEVELS, help="least level logged")
    log_format: str = _opt("text", choices=LOG_FORMATS,
                           help="text lines, or json: one object per line")
    log_key_file: str | None = _opt(None,
                                    help="seal the log: every record encrypted and"
                                         " authenticated with keys from this TOML file"
                                         " (docs/log-sealing.md; not set: plain records)")
    allow_from: str | None = _opt(None,
                                  help="accept client connections (and joining brokers)"
                                       " only from these networks: CIDR,... or loopback"
                                       " (not set: from anywhere; docs/security.md)")
    admin_allow_from: str = _opt("loopback",
                                 help="serve the admin HTTP listener only to these networks"
                                      " (CIDR,... or loopback); it asks for a login too")
    admin_password_file: str | None = _opt(None,
                                           help="at a cluster's first start, create the admin"
                                                " user with the password in this file instead"
                                                " of guest (or BATON_ADMIN_PASSWORD;"
                                                " docs/security.md)")
    admin_listen: str | None = _opt(None,
                                    help="serve metrics, health and the admin JSON API over"
                                         " HTTP here (docs/admin.md; not set: off; port 0"
                                         " picks one)")
    admin_tls_cert: str | None = _opt(None,
                                      help="PEM certificate chain of the admin listener: with"
                                           " admin_tls_key it serves HTTPS only (docs/admin.md)")
    admin_tls_key: str | None = _opt(None, help="PEM private key of admin_tls_cert")
    admin_allowed_hosts: str | None = _opt(None,
                                           help="host names (NAME or NAME:PORT, comma-separated;"
                                                " '*': any) the admin listener answers to besides"
                                                " IP addresses and localhost; other Host headers"
                                                " get 403 (DNS rebinding)")
    admin_session_idle: float = _opt(1800.0,
                                     help="seconds a console login (session cookie) lasts"
                                          " without a request before it ends")

    amqp_listen: str | None = _opt(None,
                                   help="serve AMQP 0-9-1 clients (pika, aio-pika, RabbitMQ's"
                                        " clients) here too (docs/amqp.md; not set: off;"
                                        " 5672 is the usual port, 0 picks one)")
    amqp_body_buffer: int = _opt(16 * 1024 * 1024, least=1,
                                 help="bytes of AMQP message bodies one connection may have"
                                      " announced and not yet sent whole, over all its"
                                      " channels (at least max_message); above: the"
                                      " connection is closed (506)")
    amqp_body_buffer_total: int = _opt(64 * 1024 * 1024, least=1,
                                       help="bytes of AMQP message bodies the broker holds"
                                            " half-sent over all connections (at least"
                                            " max_message); a body that would go above waits"
                                            " (its connection is not read) until others end")

    def __post_init__(self) -> None:
        if isinstance(self.log_level, str):
            self.log_level = self.log_level.upper()  # "info" is INFO, as logging reads it

    def resolved_log_url(self) -> str:
        return self.log_url or f"file:{os.path.join(self.data_dir, 'log')}"

    def problem(self) -> tuple[str, str] | None:
        """The first inconsistent setting, as (field name, what is wrong), or None."""
        if not self.data_dir:
            return "data_dir", "must be set"
        for f in fields(self):
            value = getattr(self, f.name)
            least = f.metadata.get("least")
            if least is not None and value < least:
                return f.name, f"must be at least {least}"
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                return f.name, "must be one of " + ", ".join(repr(c) for c in choices)
        if self.port > 65535:
            return "port", "must be at most 65535"
        if self.expiry_interval <= 0:
            return "expiry_interval", "must be more than 0"
        for name in ("output_grace", "hello_timeout"):
            if getattr(self, name) <= 0:
                return name, "must be more than 0"
        if self.admin_session_idle <= 0:
            return "admin_session_idle", "must be more than 0"
        if self.idle_timeout < 0:
            return "idle_timeout", "must be 0 (never) or more"
        if self.max_message > self.max_frame // 2:
            return "max_message", "must be at most half of max_frame"
        if self.node_id is not None and (
            not self.node_id or "/" in self.node_id or not self.node_id.isprintable()
        ):
            return "node_id", "must be printable, not empty, and contain no '/'"
        for name in ("allow_from", "admin_allow_from"):
            value = getattr(self, name)
            if value is not None:
                try:
                    parse_networks(value)
                except InvalidArgument as exc:
                    return name, exc.message
        for name in ("admin_listen", "amqp_listen"):
            value = getattr(self, name)
            if value is not None:
                try:
                    parse_address(value)
                except InvalidArgument as exc:
                    return name, exc.message
        if self.advertise is not None:
            try:
                host, _ = split_advertise(self.advertise, 0)
            except InvalidArgument as exc:
                return "advertise", exc.message
            if unspecified(host):
                return "advertise", "must be an address others can reach, not all interfaces"
        elif unspecified(self.host):
            return "advertise", (
                f"must be set when listening on all interfaces (host {self.host}): the"
                " address other brokers and clients reach this broker at (e.g. --advertise"
                " HOST)"
            )
        for name in self.services:
            if not name or len(name) > 255 or not name.isprintable():
                return "services", f"service name {name!r} must be 1..255 printable characters"
        return None

    def validate(self) -> None:
        """Raises InvalidArgument on inconsistent settings."""
        found = self.problem()
        if found is not None:
            raise InvalidArgument(f"{found[0]} {found[1]}")
