"""A throw-away CA and certificates signed by it (``cryptography``'s x509 builder), for
TLS benchmarks and tests: a broker certificate for 127.0.0.1 and localhost (also usable
as a client certificate), and a client one. Not for production: the keys are written
unencrypted and the certificates last a day."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Certs", "make_certs"]


@dataclass(frozen=True)
class Certs:
    """PEM files: the CA, a server certificate and key, a client certificate and key."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def make_certs(where: Path, name: str = "test") -> Certs:
    """A new CA under ``where`` (files ``NAME-*.pem``) and two certificates it signs."""
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{name} CA"))
        .issuer_name(_name(f"{name} CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common: str, server: bool) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
            # A broker's certificate is its client certificate too (the join update).
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(ca_key, hashes.SHA256()), key

    pem = serialization.Encoding.PEM
    certs = Certs(
        ca=where / f"{name}-ca.pem",
        cert=where / f"{name}-broker.pem",
        key=where / f"{name}-broker.key",
        client_cert=where / f"{name}-client.pem",
        client_key=where / f"{name}-client.key",
    )
    certs.ca.write_bytes(ca_cert.public_bytes(pem))
    server_cert, server_key = leaf("baton broker", server=True)
    certs.cert.write_bytes(server_cert.public_bytes(pem))
    _write_key(certs.key, server_key)
    client_cert, client_key = leaf("baton client", server=False)
    certs.client_cert.write_bytes(client_cert.public_bytes(pem))
    _write_key(certs.client_key, client_key)
    return certs
