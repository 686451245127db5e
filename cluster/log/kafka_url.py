"""The Kafka log's URL: where the log is, how the topic is made, and how to reach Kafka.

``kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?PARAMS]``; :mod:`batonmq.cluster.log.kafka` says
what ``replication_factor``, ``min_insync_replicas`` and ``request_timeout_ms`` do.

How Baton reaches Kafka (Kafka's own client settings, handed to every aiokafka client the log
makes: the producer, the consumers, the admin client):

* ``security_protocol`` (default ``PLAINTEXT``): ``PLAINTEXT``, ``SSL``, ``SASL_SSL`` or
  ``SASL_PLAINTEXT``.
* ``ssl_cafile=PATH`` (``SSL``, ``SASL_SSL``): the PEM bundle of the CAs that Kafka's
  certificates are checked against (default: the system's). The host name is always checked.
* ``sasl_mechanism`` (``SASL_*``, required): ``SCRAM-SHA-512``, ``SCRAM-SHA-256`` or ``PLAIN``.
* ``sasl_username=NAME`` (``SASL_*``, required).
* ``allow_plaintext_password=true``: the opt-in that ``PLAIN`` over ``SASL_PLAINTEXT`` needs,
  since it sends the password in clear.

The password is never in the URL (a parameter named like one is refused, and so is
``USER:PASSWORD@``): :func:`client_security` reads it from a file (``baton serve
--kafka-password-file``) or from the variable ``BATON_KAFKA_PASSWORD``. The URL is shown in
the broker's log lines and by ``--print-config``: it holds nothing secret (a CA file's path and
a user name are not). A path with ``&``, ``#``, ``%`` or ``+`` in it is percent-encoded.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from batonmq.cluster.errors import InvalidArgument

__all__ = [
    "PASSWORD_ENV",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "KafkaURL",
    "client_security",
    "parse_kafka_url",
    "read_password",
]

_DEFAULT_TIMEOUT_MS = 30_000
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_INT_PARAMS = ("replication_factor", "min_insync_replicas", "request_timeout_ms")
_TEXT_PARAMS = ("security_protocol", "sasl_mechanism", "sasl_username", "ssl_cafile")
_BOOL_PARAMS = ("allow_plaintext_password",)
_PARAMS = (*_INT_PARAMS, *_TEXT_PARAMS, *_BOOL_PARAMS)
#: Kafka's client security protocols (its ``security.protocol``).
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT")
#: The SASL mechanisms the log logs in with (aiokafka's; GSSAPI and OAUTHBEARER are not offered).
SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
#: The variable that holds the Kafka password when no password file is given.
PASSWORD_ENV = "BATON_KAFKA_PASSWORD"
#: Where the password goes instead of the URL (said by the errors about it).
_PASSWORD_ROUTES = f"--kafka-password-file FILE (kafka_password_file) or {PASSWORD_ENV}"


@dataclass(frozen=True, slots=True)
class KafkaURL:
    """A parsed ``kafka://`` log URL."""

    servers: tuple[str, ...]
    topic: str
    replication_factor: int = 1
    min_insync_replicas: int = 1
    request_timeout_ms: int = _DEFAULT_TIMEOUT_MS
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    ssl_cafile: str | None = None
    allow_plaintext_password: bool = False

    @property
    def bootstrap(self) -> str:
        """The servers as aiokafka's ``bootstrap_servers`` (comma-separated)."""
        return ",".join(self.servers)

    @property
    def tls(self) -> bool:
        """Whether the connections to Kafka are TLS."""
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        """Whether the log logs in to Kafka (and so needs a password)."""
        return self.security_protocol.startswith("SASL_")

    def __str__(self) -> str:
        defaults = KafkaURL((), "")
        params = []
        for name in _PARAMS:
            value = getattr(self, name)
            if value == getattr(defaults, name):
                continue
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            params.append(f"{name}={quote(text, safe='/:-')}")
        query = "?" + "&".join(params) if params else ""
        return f"kafka://{self.bootstrap}/{self.topic}{query}"


def parse_kafka_url(url: str) -> KafkaURL:
    """Parse ``kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?replication_factor=N&...]``.

    The parameters are listed in the module docstring; the password is never one of them.

    Args:
        url: the log URL.

    Returns:
        Its parts, with defaults filled in.

    Raises:
        InvalidArgument: anything malformed, with what is wrong and the expected form.
    """
    form = "kafka://HOST:PORT[,HOST:PORT]/TOPIC[?replication_factor=N&min_insync_replicas=N]"
    parts = urlsplit(url)
    if parts.scheme != "kafka" or not url.startswith("kafka://"):
        raise InvalidArgument(f"not a Kafka log URL: {url!r} (expected {form})")
    if "@" in parts.netloc:
        raise InvalidArgument(
            f"Kafka log URL {url!r} may not have a USER[:PASSWORD]@ part: the user is "
            f"sasl_username=NAME in the query, the password comes from {_PASSWORD_ROUTES}"
        )
    if parts.fragment:
        raise InvalidArgument(f"Kafka log URL {url!r} may not have a #fragment")
    servers = tuple(_parse_server(s, url) for s in parts.netloc.split(","))
    topic = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not topic:
        raise InvalidArgument(f"Kafka log URL {url!r} names no topic (expected {form})")
    if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        raise InvalidArgument(
            f"{topic!r} in {url!r} is not a valid Kafka topic name "
            "(1 to 249 of the characters A-Z a-z 0-9 . _ -)"
        )
    values: dict[str, Any] = {}
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise InvalidArgument(f"malformed query in Kafka log URL {url!r}: {exc}") from exc
    for name, text in pairs:
        if "password" in name.lower() and name not in _PARAMS:
            raise InvalidArgument(
                f"Kafka log URL {url!r} may not carry a password ({name!r}): give it by "
                f"{_PASSWORD_ROUTES}"
            )
        if name not in _PARAMS:
            raise InvalidArgument(
                f"unknown parameter {name!r} in Kafka log URL {url!r} (known: {', '.join(_PARAMS)})"
            )
        if name in values:
            raise InvalidArgument(f"parameter {name!r} given twice in Kafka log URL {url!r}")
        values[name] = _param_value(name, text, url)
    if values.get("request_timeout_ms", _DEFAULT_TIMEOUT_MS) < 1000:
        raise InvalidArgument(f"request_timeout_ms must be at least 1000 in {url!r}")
    parsed = KafkaURL(servers, topic, **values)
    if parsed.min_insync_replicas > parsed.replication_factor:
        raise InvalidArgument(
            f"min_insync_replicas={parsed.min_insync_replicas} is above "
            f"replication_factor={parsed.replication_factor} in {url!r}: no append could succeed"
        )
    _check_security(parsed, url)
    return parsed


def _param_value(name: str, text: str, url: str) -> Any:
    """One URL parameter's value as its type."""
    if name in _INT_PARAMS:
        if not text.isdigit() or int(text) < 1:
            raise InvalidArgument(f"{name} must be a positive integer, not {text!r}, in {url!r}")
        return int(text)
    if name in _BOOL_PARAMS:
        if text.lower() not in ("true", "false"):
            raise InvalidArgument(f"{name} must be true or false, not {text!r}, in {url!r}")
        return text.lower() == "true"
    if not text:
        raise InvalidArgument(f"{name} is empty in Kafka log URL {url!r}")
    known = {"security_protocol": SECURITY_PROTOCOLS, "sasl_mechanism": SASL_MECHANISMS}.get(name)
    if known is not None:
        if text.upper() not in known:
            raise InvalidArgument(
                f"unknown {name} {text!r} in Kafka log URL {url!r} (known: {', '.join(known)})"
            )
        return text.upper()
    return text


def _check_security(where: KafkaURL, url: str) -> None:
    """The security parameters must fit together."""
    protocol = where.security_protocol
    if where.sasl:
        if where.sasl_mechanism is None:
            raise InvalidArgument(
                f"security_protocol={protocol} needs sasl_mechanism "
                f"({', '.join(SASL_MECHANISMS)}) in Kafka log URL {url!r}"
            )
        if where.sasl_username is None:
            raise InvalidArgument(f"security_protocol={protocol} needs sasl_username in Kafka log URL {url!r}")
    else:
        for name in ("sasl_mechanism", "sasl_username"):
            if getattr(where, name) is not None:
                raise InvalidArgument(
                    f"{name} needs security_protocol=SASL_SSL (or SASL_PLAINTEXT), not {protocol}, "
                    f"in Kafka log URL {url!r}"
                )
    if where.ssl_cafile is not None and not where.tls:
        raise InvalidArgument(
            f"ssl_cafile needs security_protocol=SSL or SASL_SSL, not {protocol}, in Kafka log URL {url!r}"
        )
    in_clear = protocol == "SASL_PLAINTEXT" and where.sasl_mechanism == "PLAIN"
    if in_clear and not where.allow_plaintext_password:
        raise InvalidArgument(
            f"sasl_mechanism=PLAIN over security_protocol=SASL_PLAINTEXT would send the Kafka password "
            f"in clear: use SASL_SSL (or SCRAM), or add allow_plaintext_password=true to {url!r} to "
            "accept that"
        )
    if where.allow_plaintext_password and not in_clear:
        raise InvalidArgument(
            f"allow_plaintext_password is only for sasl_mechanism=PLAIN over SASL_PLAINTEXT, "
            f"in Kafka log URL {url!r}"
        )


def read_password(password_file: str | None, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The Kafka password and where it came from: the first line of ``password_file``, else
    the variable ``BATON_KAFKA_PASSWORD``, else None.

    Raises:
        InvalidArgument: the file cannot be read, or its first line is empty.
    """
    if password_file:
        try:
            with open(password_file, encoding="utf-8") as f:
                password = f.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise InvalidArgument(f"cannot read kafka_password_file {password_file}: {reason}") from None
        if not password:
            raise InvalidArgument(f"kafka_password_file {password_file} is empty (the password is its first line)")
        return password, f"kafka_password_file {password_file}"
    given = (os.environ if environ is None else environ).get(PASSWORD_ENV)
    return (given, PASSWORD_ENV) if given else None


def _parse_server(server: str, url: str) -> str:
    host, sep, port = server.rpartition(":")
    if host.startswith("[") and host.endswith("]"):  # [IPv6]:PORT
        bare = host[1:-1]
    else:
        bare = host
    if not sep or not bare or "[" in bare or "]" in bare or (":" in bare and bare == host):
        raise InvalidArgument(f"{server!r} in Kafka log URL {url!r} is not HOST:PORT")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"{server!r} in Kafka log URL {url!r} has no valid port")
    return f"{host}:{int(port)}"


def client_security(
    where: KafkaURL, password_file: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], str]:
    """aiokafka's security options for the URL ``where``, the same for every client.

    Args:
        where: the parsed log URL.
        password_file: the file whose first line is the SASL password; not given:
            ``BATON_KAFKA_PASSWORD``.
        environ: where that variable is looked up (default: the process's environment).

    Returns:
        The options (``security_protocol``, ``ssl_context``, ``sasl_*``), and where the
        password came from ("" without SASL), for the errors about a refused login.

    Raises:
        InvalidArgument: a CA file that cannot be used, a password file that cannot be
            read, SASL without a password, or a password file for a log that does not log in.
    """
    options: dict[str, Any] = {"security_protocol": where.security_protocol}
    if where.tls:
        try:
            options["ssl_context"] = ssl.create_default_context(cafile=where.ssl_cafile)
        except (OSError, ssl.SSLError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise InvalidArgument(f"cannot use ssl_cafile {where.ssl_cafile} of {where}: {reason}") from None
    if not where.sasl:
        if password_file:
            raise InvalidArgument(
                f"kafka_password_file is set but the Kafka log {where} does not log in "
                "(no security_protocol=SASL_SSL or SASL_PLAINTEXT)"
            )
        return options, ""
    found = read_password(password_file, environ)
    if found is None:
        raise InvalidArgument(
            f"the Kafka log {where} logs in as {where.sasl_username!r} ({where.sasl_mechanism}) "
            f"but no password is given: give it by {_PASSWORD_ROUTES}"
        )
    password, source = found
    options.update(
        sasl_mechanism=where.sasl_mechanism,
        sasl_plain_username=where.sasl_username,
        sasl_plain_password=password,
    )
    return options, source
