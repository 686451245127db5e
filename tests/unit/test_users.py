"""Users in the replicated state, and the SCRAM exchange that checks their passwords."""

from __future__ import annotations

import pytest

from batonmq.clients import scram
from batonmq.cluster.effects import RightsChanged
from batonmq.cluster.errors import AccessRefused, InvalidArgument
from batonmq.cluster.events import DeleteUser, PutUser, SetRights
from batonmq.cluster.results import UserChanged
from batonmq.cluster.state import State
from batonmq.cluster.users import (
    GUEST,
    GUEST_COST,
    GUEST_SALT,
    GUEST_SERVER_KEY,
    GUEST_STORED_KEY,
    Users,
)
from tests.unit.test_membership import Cluster

FAST = 1 << 10  # a cheap scrypt for tests


def _creds(password: str) -> tuple[bytes, int, bytes, bytes]:
    c = scram.make_credentials(password, cost=FAST)
    return c.salt, c.cost, c.stored_key, c.server_key


def _login(creds: scram.Credentials | None, user: str, password: str) -> None:
    client = scram.ClientExchange(user, password)
    server = scram.ServerExchange(lambda name: creds if name == user else None, b"s" * 32)
    final = client.final(server.first(client.first()))
    client.verify(server.final(final))


def test_the_default_guest_credentials_are_those_of_the_password_guest() -> None:
    c = scram.make_credentials("guest", salt=GUEST_SALT, cost=GUEST_COST)
    assert (c.stored_key, c.server_key) == (GUEST_STORED_KEY, GUEST_SERVER_KEY)
    assert Users().get(GUEST) is not None and Users().get(GUEST).admin  # type: ignore[union-attr]


def test_scram_accepts_the_password_and_refuses_another() -> None:
    creds = scram.make_credentials("s3cret", cost=FAST)
    _login(creds, "alice", "s3cret")
    with pytest.raises(AccessRefused, match="wrong user name or password"):
        _login(creds, "alice", "guess")
    with pytest.raises(AccessRefused, match="wrong user name or password"):
        _login(None, "nobody", "s3cret")  # an unknown user fails the same way
    assert scram.check_password(creds, "s3cret") and not scram.check_password(creds, "x")


def test_a_client_refuses_a_broker_that_does_not_know_the_credentials() -> None:
    client = scram.ClientExchange("alice", "pw")
    server = scram.ServerExchange(lambda _: scram.make_credentials("pw", cost=FAST), b"s" * 32)
    client.final(server.first(client.first()))
    with pytest.raises(AccessRefused, match="could not prove"):
        client.verify(b"v=" + b"AAAA" * 11)


def test_a_challenge_with_an_unbounded_cost_is_refused_by_the_client() -> None:
    client = scram.ClientExchange("alice", "pw", nonce="abc")
    with pytest.raises(AccessRefused, match="cost out of bounds"):
        client.final(b"r=abcdef,s=c2FsdHNhbHQ=,i=1073741824")
    with pytest.raises(AccessRefused, match="nonce"):
        scram.ClientExchange("alice", "pw", nonce="abc").final(b"r=xyz123,s=c2FsdA==,i=1024")


def test_names_with_commas_and_equals_signs_survive_the_exchange() -> None:
    creds = scram.make_credentials("pw", cost=FAST)
    _login(creds, "a,b=c", "pw")


def _cluster() -> tuple[Cluster, str, str]:
    c = Cluster()
    a, b = "a/1", "b/1"
    c.beat(a)
    c.beat(a, b)
    return c, a, b


def test_user_events_apply_and_the_initial_admin_replaces_guest() -> None:
    c, a, b = _cluster()
    users = c.state.users
    assert users.names() == ["guest"] and not users.explicit
    first = c.apply(a, PutUser("admin", *_creds("pw"), True, initial=True))
    assert first.error is None and first.result == UserChanged(True)
    again = c.apply(b, PutUser("admin2", *_creds("pw"), True, initial=True))
    assert again.result == UserChanged(False)  # the first start's admin, once only
    assert users.names() == ["admin"]  # and no guest any more
    c.apply(a, PutUser("bob", *_creds("pw"), False))
    c.apply(a, SetRights("bob", (("read", "jobs\\..*"), ("write", "jobs\\.in"))))
    bob = users.get("bob")
    assert bob is not None
    assert bob.may("read", "jobs.x") and not bob.may("read", "jobsx")
    assert not bob.may("read", "x.jobs.y")  # the whole name must match
    assert bob.may("write", "jobs.in") and not bob.may("write", "jobs.out")
    assert not bob.may("configure", "jobs.in") and not bob.may("lead", "svc")
    # A new password keeps the rights.
    c.apply(a, PutUser("bob", *_creds("other"), False))
    assert users.get("bob").may("read", "jobs.x")  # type: ignore[union-attr]
    bad = c.apply(a, SetRights("bob", (("read", "("),)))
    assert isinstance(bad.error, InvalidArgument)
    last = c.apply(a, DeleteUser("admin"))
    assert isinstance(last.error, InvalidArgument) and "last admin" in str(last.error)
    assert c.apply(a, DeleteUser("bob")).result == UserChanged(True)
    assert c.apply(a, DeleteUser("bob")).result == UserChanged(False)
    bad_name = c.apply(a, PutUser("x\n", *_creds("pw"), False))
    assert isinstance(bad_name.error, InvalidArgument)
    assert c.state.ignored.get("bad-user") == 1


def test_users_survive_a_snapshot_and_old_snapshots_restore_guest() -> None:
    c, a, _ = _cluster()
    c.apply(a, PutUser("carol", *_creds("pw"), False))
    c.apply(a, SetRights("carol", (("configure", ".*"),)))
    restored = State()
    restored.restore_meta(c.state.meta_snapshot())
    assert restored.users.names() == ["carol", "guest"]
    assert restored.users.get("carol") == c.state.users.get("carol")
    assert restored.digest() == c.state.digest()
    old = State()
    old.restore_meta(State().meta_snapshot()[:8])  # written before users existed
    assert old.users.names() == ["guest"] and not old.users.explicit


def test_guest_may_log_in_from_loopback_only() -> None:
    from batonmq.broker.access import Login

    for loopback in (True, False):
        users = Users()
        login = Login(users, b"s" * 32)
        client = scram.ClientExchange("guest", "guest")
        first = login.first({"mechanism": scram.MECHANISM, "message": client.first()})
        final = {"message": client.final(first)}
        if loopback:
            user, outcome = login.final(final, True, "127.0.0.1:5000")
            client.verify(outcome)
            assert user.name == GUEST
        else:
            with pytest.raises(AccessRefused, match="loopback only"):
                login.final(final, False, "10.1.2.3:5000")


def test_the_loopback_test_knows_mapped_and_v6_loopback() -> None:
    from batonmq.broker.networks import LOOPBACK, allows

    def _is_loopback(host: str) -> bool:
        return allows(LOOPBACK, host)

    assert _is_loopback("127.0.0.1") and _is_loopback("127.3.4.5") and _is_loopback("::1")
    assert _is_loopback("::ffff:127.0.0.1") and not _is_loopback("::ffff:10.0.0.1")
    assert not _is_loopback("10.0.0.1") and not _is_loopback("not-an-ip")


def test_the_url_form_names_the_user_and_the_spark_source_takes_it() -> None:
    from batonmq.clients.addresses import split_url
    from batonmq.clients.spark import _options

    assert split_url("baton://alice:p%40ss@h1:5671,h2:5672") == ("h1:5671,h2:5672", "alice", "p@ss")
    assert split_url("baton://h1:5671") == ("h1:5671", None, None)
    assert split_url("h1:5671") == ("h1:5671", None, None)
    with pytest.raises(InvalidArgument, match="unknown address scheme"):
        split_url("amqp://h1:5672")
    url = "baton://alice:pw@127.0.0.1:5671,127.0.0.1:5672"
    assert _options({"brokers": url, "queue": "q"}).brokers == url  # connect() reads it
    with pytest.raises(InvalidArgument, match="bad address"):
        _options({"brokers": "baton://alice:pw@nonsense:abc", "queue": "q"})
    # A read task that tries the next broker keeps the user and the fencing options.
    from batonmq.clients.spark import _rotate

    opts = _options({"brokers": url, "queue": "q", "service": "s", "token": "3"})
    turned = _rotate(opts)
    assert turned.brokers == "baton://alice:pw@127.0.0.1:5672,127.0.0.1:5671"
    assert split_url(turned.brokers)[1:] == ("alice", "pw")
    assert (turned.service, turned.token) == ("s", 3)
    assert _rotate(_options({"brokers": "h1:1,h2:2", "queue": "q"})).brokers == "h2:2,h1:1"


def test_every_applied_user_change_asks_the_brokers_to_look_again_at_its_sessions() -> None:
    """A RightsChanged effect per applied user event (the brokers then cancel what the
    user may no longer have, docs/security.md); none for a refused one."""
    c, a, _ = _cluster()

    def changed() -> list[str]:
        out = [e.user for e in c.effects if isinstance(e, RightsChanged)]
        c.effects.clear()
        return out

    c.apply(a, PutUser("bob", *_creds("pw"), False))
    assert changed() == ["bob"]
    c.apply(a, SetRights("bob", (("read", ""),)))
    assert changed() == ["bob"]
    c.apply(a, SetRights("bob", (("read", "("),)))  # refused: nothing changed
    assert changed() == []
    c.apply(a, DeleteUser("bob"))
    assert changed() == ["bob"]
