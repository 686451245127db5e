"""The AMQP listener's login: the user and password of a ``Connection.StartOk``
(SASL ``PLAIN`` or ``AMQPLAIN``), checked against the cluster's users by
broker/access.py's ``check_password_login`` (docs/amqp.md, docs/security.md)."""

from __future__ import annotations

import struct
from typing import Final

from pamqp import decode as pamqp_decode

from batonmq.broker.access import check_password_login
from batonmq.cluster.users import Users

__all__ = ["MECHANISMS", "check_login"]

#: The SASL mechanisms the listener offers in ``Connection.Start``.
MECHANISMS: Final = "PLAIN AMQPLAIN"


def _credentials(mechanism: str, response: str | bytes) -> tuple[str, str]:
    """The user and password of a StartOk's response.

    Raises:
        ValueError: not the mechanism's form.
    """
    data = response.encode("utf-8", "surrogatepass") if isinstance(response, str) else bytes(response)
    if mechanism == "PLAIN":
        parts = data.split(b"\0")
        if len(parts) != 3:
            raise ValueError("a PLAIN response is authzid NUL user NUL password")
        return parts[1].decode(), parts[2].decode()
    if mechanism == "AMQPLAIN":
        _, table = pamqp_decode.field_table(struct.pack(">I", len(data)) + data)
        user, password = table.get("LOGIN"), table.get("PASSWORD")
        if isinstance(user, bytes):
            user = user.decode()
        if isinstance(password, bytes):
            password = password.decode()
        if not isinstance(user, str) or not isinstance(password, str):
            raise ValueError("an AMQPLAIN response is a table of LOGIN and PASSWORD")
        return user, password
    raise ValueError(f"unknown mechanism {mechanism!r} (this broker has {MECHANISMS})")


def check_login(users: Users, mechanism: str, response: str | bytes, loopback: bool) -> str:
    """The user a StartOk logs in as (does the password's scrypt work: run it off the
    event loop; the check is broker/access.py's ``check_password_login``).

    Raises:
        PermissionError: the login is refused (the text says why, without telling
            whether the user exists).
    """
    try:
        name, password = _credentials(mechanism, response)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PermissionError(str(exc)) from None
    try:
        return check_password_login(users, name, password, loopback).name
    except PermissionError as exc:
        if not str(exc).startswith("wrong user name"):
            raise  # guest from beyond loopback: said as it is
        raise PermissionError(
            f"Login was refused using authentication mechanism {mechanism}: {exc}"
        ) from None
