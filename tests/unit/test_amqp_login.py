"""The AMQP listener's login (broker/amqp_connection.py ``check_login``): SASL PLAIN and
AMQPLAIN responses checked against Baton's users, guest from loopback only."""

from __future__ import annotations

import struct

import pytest
from pamqp import encode

from batonmq.broker.amqp_login import check_login
from batonmq.clients import scram
from batonmq.cluster.users import User, Users


def amqplain(user: str, password: str) -> bytes:
    table = encode.field_table({"LOGIN": user, "PASSWORD": password})
    (size,) = struct.unpack(">I", table[:4])
    assert size == len(table) - 4
    return table[4:]  # AMQPLAIN is the table without its length


def users_with_dave() -> Users:
    users = Users()
    creds = scram.make_credentials("dave-pw", cost=1 << 10)
    users.put(User("dave", creds.salt, creds.cost, creds.stored_key, creds.server_key))
    return users


def test_plain_and_amqplain_log_in() -> None:
    users = users_with_dave()
    assert check_login(users, "PLAIN", "\0dave\0dave-pw", loopback=False) == "dave"
    assert check_login(users, "PLAIN", b"\0dave\0dave-pw", loopback=False) == "dave"
    assert check_login(users, "AMQPLAIN", amqplain("dave", "dave-pw"), loopback=False) == "dave"
    assert check_login(Users(), "PLAIN", "\0guest\0guest", loopback=True) == "guest"


@pytest.mark.parametrize(
    "mechanism, response, loopback, why",
    [
        ("PLAIN", "\0dave\0wrong", True, "wrong user name or password for 'dave'"),
        ("PLAIN", "\0nobody\0x", True, "wrong user name or password for 'nobody'"),
        ("AMQPLAIN", amqplain("dave", "nope"), True, "wrong user name or password"),
        ("PLAIN", "dave-pw", True, "authzid NUL user NUL password"),
        ("AMQPLAIN", b"\xff\xff", True, ""),
        ("EXTERNAL", "", True, "unknown mechanism 'EXTERNAL'"),
        ("PLAIN", "\0guest\0guest", False, "loopback only"),
    ],
)
def test_refused_logins_say_why(mechanism: str, response: str | bytes, loopback: bool,
                                why: str) -> None:
    with pytest.raises(PermissionError) as info:
        check_login(users_with_dave(), mechanism, response, loopback)
    assert why in str(info.value)
