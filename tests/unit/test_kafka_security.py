"""How a Kafka log gets its TLS and SASL options (batonmq.cluster.log.kafka_url): the password
from a file or BATON_KAFKA_PASSWORD, never the URL, and one clear line for each mistake. No
Kafka needed: every case here fails, or is decided, before connecting (the real listener's
tests are in tests/contract/test_log.py and tests/integration/test_kafka_security.py)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.log import open_log
from batonmq.cluster.log.kafka_url import client_security, parse_kafka_url
from batonmq.loadtest.certs import make_certs

SASL = "kafka://127.0.0.1:1/t?security_protocol=SASL_SSL&sasl_mechanism=SCRAM-SHA-512&sasl_username=baton"


def _password_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kafka.password"
    path.write_text(text)
    return str(path)


def test_the_password_is_the_first_line_of_its_file(tmp_path: Path) -> None:
    path = _password_file(tmp_path, "s3cret\nignored\n")
    options, source = client_security(parse_kafka_url(SASL), path, {"BATON_KAFKA_PASSWORD": "from-env"})
    assert options["sasl_plain_password"] == "s3cret"  # the file wins over the variable
    assert (options["security_protocol"], options["sasl_mechanism"], options["sasl_plain_username"]) == (
        "SASL_SSL", "SCRAM-SHA-512", "baton")
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert options["ssl_context"].check_hostname and options["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert source == f"kafka_password_file {path}"


def test_without_a_file_the_password_comes_from_the_environment() -> None:
    options, source = client_security(parse_kafka_url(SASL), None, {"BATON_KAFKA_PASSWORD": "from-env"})
    assert (options["sasl_plain_password"], source) == ("from-env", "BATON_KAFKA_PASSWORD")


def test_a_plaintext_log_gets_no_tls_and_no_sasl() -> None:
    options, source = client_security(parse_kafka_url("kafka://k:1/t"), None, {"BATON_KAFKA_PASSWORD": "x"})
    assert (options, source) == ({"security_protocol": "PLAINTEXT"}, "")


def test_ssl_cafile_is_the_only_ca(tmp_path: Path) -> None:
    certs = make_certs(tmp_path, "k")
    options, _ = client_security(parse_kafka_url(f"kafka://k:1/t?security_protocol=SSL&ssl_cafile={certs.ca}"))
    (ca,) = options["ssl_context"].get_ca_certs()
    assert ca["subject"] == ((("commonName", "k CA"),),)


#: The password files of the cases below: None (none given), or a name in the test's tmp_path
#: and what that file holds (None: it does not exist).
_FILES = {"missing": None, "empty": "\nsecond line\n", "pw": "pw\n"}


@pytest.mark.parametrize(
    ("url", "password_file", "environ", "error"),
    [
        (SASL, "missing", {}, r"^cannot read kafka_password_file .*missing: No such file or directory$"),
        (SASL, "empty", {}, r"^kafka_password_file .*empty is empty \(the password is its first line\)$"),
        (SASL, None, {}, r"logs in as 'baton' \(SCRAM-SHA-512\) but no password is given: give it by "
                         r"--kafka-password-file FILE \(kafka_password_file\) or BATON_KAFKA_PASSWORD$"),
        (SASL, None, {"BATON_KAFKA_PASSWORD": ""}, "but no password is given"),
        ("kafka://k:1/t", "pw", {}, "kafka_password_file is set but the Kafka log kafka://k:1/t does not log in"),
        ("kafka://k:1/t?security_protocol=SSL&ssl_cafile=/nonexistent/ca.pem", None, {},
         "^cannot use ssl_cafile /nonexistent/ca.pem of .*: No such file or directory$"),
    ],
)
def test_mistakes_are_one_line(
    tmp_path: Path, url: str, password_file: str | None, environ: dict[str, str], error: str
) -> None:
    path = None
    if password_file is not None:
        path = tmp_path / password_file
        content = _FILES[password_file]
        if content is not None:
            path.write_text(content)
    with pytest.raises(InvalidArgument, match=error) as caught:
        client_security(parse_kafka_url(url), None if path is None else str(path), environ)
    assert "\n" not in caught.value.message


async def test_open_log_refuses_a_password_file_for_a_log_not_on_kafka(tmp_path: Path) -> None:
    path = _password_file(tmp_path, "pw\n")
    with pytest.raises(InvalidArgument, match="kafka_password_file is set but the log 'memory:' is not on Kafka"):
        await open_log("memory:", kafka_password_file=path)


async def test_open_log_reads_the_password_before_connecting(tmp_path: Path) -> None:
    """A missing password file is InvalidArgument at once, not a connection attempt that fails."""
    with pytest.raises(InvalidArgument, match="cannot read kafka_password_file"):
        await open_log(SASL, kafka_password_file=str(tmp_path / "nope"))
