"""Policies in the replicated state (cluster/policies.py, docs/operations.md "Policies"):
validation, matching (one policy a queue: highest priority, ties by name), RabbitMQ's
precedence between a policy and the declare, log order on existing and later queues,
behind the flag ``policies``, and invisible in a cluster that never set one."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from batonmq.cluster.codec import decode, encode
from batonmq.cluster.errors import InvalidArgument, QueueExists, QueueFull
from batonmq.cluster.events import ClearPolicy, DeclareQueue, Enqueue, Origin, SetPolicy
from batonmq.cluster.policies import (
    MAX_PATTERN,
    Policies,
    check_definition,
    check_pattern,
    effective,
    make_policy,
)
from batonmq.cluster.results import PolicyChanged
from batonmq.cluster.state import State
from tests.unit.test_membership import Cluster
from tests.unit.test_users import _cluster


def _flagged() -> tuple[Cluster, str]:
    c, a, _ = _cluster()
    # What an applied EnableFeatures(("policies",)) leaves (tests/unit/test_features.py
    # covers how a flag gets enabled).
    c.state.features.enabled["policies"] = c.state.applied
    return c, a


def _set(name: str, pattern: str, priority: int = 0, **definition: Any) -> SetPolicy:
    d = {k.replace("_", "-"): v for k, v in definition.items()}
    return SetPolicy(name, pattern, "queues", check_definition(d), priority)


# -- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("definition", "said"),
    [
        ({}, "non-empty map"),
        ([["max-length", 1]], "non-empty map"),
        ({"max-lenght": 5}, "unknown policy key 'max-lenght'"),
        ({"max-length": "5"}, "'max-length' must be an integer"),
        ({"max-length": 0}, "'max-length' must be an integer of 1 or more"),
        ({"message-ttl": True}, "'message-ttl' must be an integer"),
        ({"delivery-limit": 2.5}, "'delivery-limit' must be an integer"),
        ({"overflow": "reject"}, "'overflow' must be one of"),
        ({"dead-letter": ""}, "must name a queue"),
        ({"dead-letter": 5}, "'dead-letter' must be a string"),
        ({"dead-letter": "d", "dead-letter-exchange": "x"}, "not both"),
        ({"dead-letter-routing-key": "k"}, "needs 'dead-letter-exchange'"),
        ({"dead-letter-exchange": "bad\x00name"}, "exchange name"),
        ({"retry": "exponential"}, "'retry' must be a map"),
        ({"retry": {"policy": "sometimes", "delay": 5}}, "retry policy must be one of"),
        ({"retry": {"policy": "fixed"}}, "'retry.delay' must be an integer"),
        ({"retry": {"policy": "fixed", "delay": 5, "max": 2}}, "not be below its delay"),
        ({"retry": {"policy": "fixed", "delay": 5, "jitter": 2}}, "unknown retry key 'jitter'"),
    ],
)
def test_a_bad_definition_is_refused_with_one_clear_line(definition: Any, said: str) -> None:
    with pytest.raises(InvalidArgument, match=said) as err:
        check_definition(definition)
    assert "\n" not in str(err.value)


def test_a_definition_is_canonical() -> None:
    assert check_definition({"max-length": 5, "dead-letter": "x.dlq",
                             "retry": {"max": 9, "delay": 3, "policy": "linear"}}) == (
        ("dead-letter", "x.dlq"), ("max-length", 5),
        ("retry", {"policy": "linear", "delay": 3, "max": 9}),
    )


@pytest.mark.parametrize(
    ("pattern", "said"),
    [
        ("", "non-empty"),
        ("a" * (MAX_PATTERN + 1), f"at most {MAX_PATTERN}"),
        ("(unclosed", "bad policy pattern"),
        ("(a+)+$", "nests a repetition"),
        ("^(a|aa)*b(x*)*", "nests a repetition"),
        ("(?:[a-z]*\\.)*end", "nests a repetition"),
        ("(a|aa)+$", "nests a repetition"),
        ("(?:ab|abc)*$", "nests a repetition"),
        ("(aa?)+$", "nests a repetition"),
        ("(a{1,100})+$", "nests a repetition"),
        (7, "non-empty regular expression"),
    ],
)
def test_a_bad_or_slow_pattern_is_refused(pattern: Any, said: str) -> None:
    with pytest.raises(InvalidArgument, match=said):
        check_pattern(pattern)


def test_safe_patterns_compile_and_evil_input_matches_fast() -> None:
    for ok in ("^x\\.", "^(jobs|tasks)\\.[a-z]+$", ".*", "a{2,5}b", "(ab){3}c+",
               "^(?:foo|bar)+\\.q$", "(?:ab|ac)+", "(x{3})+", "(?:a|[ab])+$"):
        check_pattern(ok)
    regex = check_pattern("^(a|b)+c$")
    began = time.perf_counter()
    assert regex.search("ab" * 127) is None
    assert time.perf_counter() - began < 0.1
    # What the check refuses is slow indeed, on a name of 31 characters (tenfold for
    # every five more).
    slow = re.compile("(a|aa)+$")
    began = time.perf_counter()
    assert slow.search("a" * 30 + "!") is None
    assert time.perf_counter() - began > 0.05


def test_make_policy_checks_every_part() -> None:
    with pytest.raises(InvalidArgument, match="apply-to"):
        make_policy("p", ".*", "exchanges", {"max-length": 1}, 0)
    with pytest.raises(InvalidArgument, match="priority"):
        make_policy("p", ".*", "queues", {"max-length": 1}, -1)
    with pytest.raises(InvalidArgument, match="priority"):
        make_policy("p", ".*", "queues", {"max-length": 1}, True)
    with pytest.raises(InvalidArgument, match="policy name"):
        make_policy("", ".*", "queues", {"max-length": 1}, 0)


# -- matching and precedence ------------------------------------------------------------------


def test_one_policy_applies_the_highest_priority_then_the_first_name() -> None:
    table = Policies()
    table.put(make_policy("b-wide", ".*", "queues", {"max-length": 1}, 1))
    table.put(make_policy("a-wide", ".", "all", {"max-length": 2}, 1))
    table.put(make_policy("jobs", "^jobs\\.", "queues", {"max-length": 3}, 5))
    table.put(make_policy("low", "^jobs\\.", "queues", {"max-length": 4}, 0))
    assert table.for_queue("jobs.in").name == "jobs"  # type: ignore[union-attr]
    assert table.for_queue("other").name == "a-wide"  # type: ignore[union-attr]
    table.clear("jobs")
    assert table.for_queue("jobs.in").name == "a-wide"  # type: ignore[union-attr]
    assert table.for_queue("ab.jobs.x").name == "a-wide"  # type: ignore[union-attr]
    only = Policies()
    only.put(make_policy("jobs", "jobs", "queues", {"max-length": 3}, 0))
    assert only.for_queue("myjobs") is not None  # searched, not anchored, as RabbitMQ
    assert only.for_queue("other") is None


def _declared(**given: Any) -> dict[str, Any]:
    base = {"max_length": None, "overflow": "reject-publish", "delivery_limit": 20,
            "dead_letter": None, "dead_letter_exchange": None, "dead_letter_routing_key": None,
            "message_ttl_ms": None, "retry": "", "retry_delay_ms": 0, "retry_max_ms": None}
    base.update(given)
    return base


def test_rabbitmq_precedence_between_the_declare_and_the_policy() -> None:
    policy = {"max-length": 100, "message-ttl": 5000, "delivery-limit": 5,
              "overflow": "drop-head", "dead-letter": "p.dlq",
              "retry": {"policy": "fixed", "delay": 10}}
    # Nothing declared: the policy's values.
    eff = effective(_declared(), "q", policy)
    assert (eff["max_length"], eff["message_ttl_ms"], eff["delivery_limit"]) == (100, 5000, 5)
    assert (eff["overflow"], eff["dead_letter"]) == ("drop-head", "p.dlq")
    assert (eff["retry"], eff["retry_delay_ms"], eff["retry_max_ms"]) == ("fixed", 10, None)
    # Numbers: the lower of the two.
    eff = effective(_declared(max_length=10, message_ttl_ms=60000, delivery_limit=3), "q", policy)
    assert (eff["max_length"], eff["message_ttl_ms"], eff["delivery_limit"]) == (10, 5000, 3)
    eff = effective(_declared(delivery_limit=50), "q", policy)
    assert eff["delivery_limit"] == 5
    # The others: the declare's own wins where it gave one.
    eff = effective(_declared(overflow="drop-head", dead_letter_exchange="dlx",
                              retry="linear", retry_delay_ms=7), "q",
                    {**policy, "overflow": "reject-publish"})
    assert eff["overflow"] == "drop-head" and eff["dead_letter"] is None
    assert eff["dead_letter_exchange"] == "dlx" and (eff["retry"], eff["retry_delay_ms"]) == ("linear", 7)
    # A dead-letter exchange from the policy, with its key; a queue never its own DLQ.
    eff = effective(_declared(), "q", {"dead-letter-exchange": "", "dead-letter-routing-key": "k"})
    assert (eff["dead_letter_exchange"], eff["dead_letter_routing_key"]) == ("", "k")
    assert effective(_declared(), "p.dlq", policy)["dead_letter"] is None


# -- in the state, in log order ---------------------------------------------------------------


def test_without_the_flag_a_policy_is_refused_and_nothing_changes() -> None:
    c, a, _ = _cluster()
    plain, _, _ = _cluster()
    for cl in (c, plain):
        cl.apply(a, DeclareQueue("jobs.in"))
    refused = c.apply(a, _set("cap", "^jobs", max_length=1))
    assert isinstance(refused.error, InvalidArgument) and "feature flag policies" in str(refused.error)
    assert isinstance(c.apply(a, ClearPolicy("cap")).error, InvalidArgument)
    assert len(c.state.policies) == 0 and c.state.queues["jobs.in"].max_length is None
    assert len(c.state.meta_snapshot()) == len(plain.state.meta_snapshot())
    # The queue is the one a cluster that never saw them has.
    assert c.state.queues["jobs.in"].snapshot()[2:] == plain.state.queues["jobs.in"].snapshot()[2:]


def test_a_flagged_cluster_without_policies_keeps_its_snapshots() -> None:
    c, a = _flagged()
    c.apply(a, DeclareQueue("q", max_length=5))
    meta = c.state.meta_snapshot()
    assert len(meta) == 11  # the feature flags' part, no policies' part
    stats = c.state.queues["q"].stats()
    assert stats["policy"] is None and stats["max_length"] == 5


def test_a_policy_applies_to_existing_and_later_queues_and_clears() -> None:
    c, a = _flagged()
    c.apply(a, DeclareQueue("jobs.a", max_length=10))
    c.apply(a, DeclareQueue("other"))
    done = c.apply(a, _set("jobs", "^jobs\\.", max_length=3, delivery_limit=2, dead_letter="jobs.dlq"))
    assert done.result == PolicyChanged(changed=True, queues=1)
    q = c.state.queues["jobs.a"]
    assert (q.policy, q.max_length, q.delivery_limit, q.dead_letter) == ("jobs", 3, 2, "jobs.dlq")
    assert c.state.queues["other"].policy is None
    # Declaring it again with its own settings is no conflict: they are compared as declared.
    assert c.apply(a, DeclareQueue("jobs.a", max_length=10)).error is None
    assert isinstance(c.apply(a, DeclareQueue("jobs.a", max_length=3)).error, QueueExists)
    # A queue declared later takes it at its declare.
    c.apply(a, DeclareQueue("jobs.b"))
    assert c.state.queues["jobs.b"].max_length == 3
    # The effective max-length is what the state machine enforces.
    for i in range(3):
        assert c.apply(a, Enqueue("jobs.b", ((b"m", {}),))).error is None
    assert isinstance(c.apply(a, Enqueue("jobs.b", ((b"m", {}),))).error, QueueFull)
    # Replaced by a higher-priority one, then cleared: back to the declared settings.
    c.apply(a, _set("all", ".", 9, message_ttl=1000))
    assert (q.policy, q.max_length, q.message_ttl_ms, q.dead_letter) == ("all", 10, 1000, None)
    assert c.apply(a, ClearPolicy("all")).result == PolicyChanged(changed=True, queues=2)
    assert q.policy == "jobs"
    assert c.apply(a, ClearPolicy("jobs")).result == PolicyChanged(changed=True, queues=0)
    assert (q.policy, q.max_length, q.delivery_limit, q.dead_letter) == (None, 10, 20, None)
    assert q.declared is None
    assert c.apply(a, ClearPolicy("jobs")).result == PolicyChanged(changed=False, queues=0)


def test_a_forged_bad_policy_record_is_refused_at_apply() -> None:
    c, a = _flagged()
    bad = c.apply(a, SetPolicy("p", "(a+)+", "queues", (("max-length", 1),), 0))
    assert isinstance(bad.error, InvalidArgument) and len(c.state.policies) == 0
    bad = c.apply(a, SetPolicy("p", "x", "queues", (("max-length", "many"),), 0))
    assert isinstance(bad.error, InvalidArgument) and len(c.state.policies) == 0


def test_replicas_agree_and_a_restore_derives_the_effective_settings_again() -> None:
    c, a = _flagged()
    c.apply(a, DeclareQueue("jobs.a", max_length=10, delivery_limit=4))
    c.apply(a, _set("jobs", "^jobs", 1, max_length=3, retry={"policy": "fixed", "delay": 50}))
    c.apply(a, _set("wide", ".", 0, delivery_limit=2))
    digest = c.state.digest()
    snap = c.state.full_snapshot()
    # The queue's snapshot keeps its declared settings; the policies are in the meta part.
    assert snap[2][0][2][1] == 10 and len(snap[0]) == 12
    other = State()
    other.install(snap)
    q = other.queues["jobs.a"]
    assert (q.policy, q.max_length, q.delivery_limit, q.retry) == ("jobs", 3, 4, "fixed")
    assert other.digest() == digest
    assert [p.name for p in other.policies.listed()] == ["jobs", "wide"]


def test_policy_events_round_trip_through_the_codec() -> None:
    origin = Origin("n", "r", 1, 0)
    ev = _set("p", "^x", 3, max_length=5, retry={"policy": "exponential", "delay": 5, "max": 50})
    assert decode(encode(origin, ev))[1] == ev
    assert decode(encode(origin, ClearPolicy("p")))[1] == ClearPolicy("p")
