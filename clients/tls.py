"""TLS contexts for Baton's connections (stdlib :mod:`ssl`), with one-line errors.

:func:`client_context` is what a client (or a joining broker) connects with: it
verifies the broker's certificate against a CA bundle (or the system's CAs) and its
host name or IP address, and may present a client certificate.
:func:`server_context` is what a broker listens with (docs/security.md).

A file that cannot be read, or does not hold what it should, raises
:class:`~batonmq.cluster.errors.InvalidArgument` naming the file.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from batonmq.cluster.errors import InvalidArgument

__all__ = ["NOT_TLS_HINT", "client_context", "server_context"]

#: What a plaintext client is told when the broker answered with TLS (or dropped it).
NOT_TLS_HINT = "the broker expects TLS (use --tls-ca / ssl=)"


def _load(what: str, path: str, load: Callable[[], object]) -> None:
    try:
        load()
    except FileNotFoundError:
        raise InvalidArgument(f"{what} {path}: no such file") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise InvalidArgument(f"{what} {path} cannot be used: {reason}") from None


def client_context(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A context that verifies the broker (certificate and host name).

    Args:
        ca_file: PEM CA bundle the broker's certificate must chain to (None: the
            system's CAs).
        cert_file, key_file: a client certificate to present (brokers that verify
            clients ask for one).

    Raises:
        InvalidArgument: a file cannot be read or is not what it should be.
    """
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ca_file:
        _load("TLS CA file", ca_file, lambda: ctx.load_verify_locations(cafile=ca_file))
    if cert_file:
        _load(
            "TLS certificate", cert_file, lambda: ctx.load_cert_chain(cert_file, key_file)
        )
    return ctx


def server_context(
    cert_file: str, key_file: str, ca_file: str | None = None, verify_clients: bool = False
) -> ssl.SSLContext:
    """A broker's listening context (TLS 1.2 or later).

    Args:
        cert_file, key_file: the broker's PEM certificate chain and private key.
        ca_file: PEM CA bundle that client certificates must chain to.
        verify_clients: refuse a client without a certificate signed by ``ca_file``.

    Raises:
        InvalidArgument: a file cannot be read, the key does not match the
            certificate, or ``verify_clients`` without ``ca_file``.
    """
    if verify_clients and not ca_file:
        raise InvalidArgument("tls_verify_clients needs tls_ca (the CA of the client certificates)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load("TLS certificate", cert_file, lambda: ctx.load_cert_chain(cert_file, key_file))
    if ca_file:
        _load("TLS CA file", ca_file, lambda: ctx.load_verify_locations(cafile=ca_file))
    ctx.verify_mode = ssl.CERT_REQUIRED if verify_clients else ssl.CERT_NONE
    return ctx
