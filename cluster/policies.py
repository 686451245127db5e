"""Policies: settings for the queues whose names match a pattern, as RabbitMQ's policies
(docs/operations.md "Policies"; flag ``policies``, docs/design.md §15).

Pure: no I/O, no clock. A policy is a name, a regular expression over queue names, what
it applies to, a definition (``max-length``, ``message-ttl``, ``delivery-limit``, ...)
and a priority. At most one policy applies to a queue: of those whose pattern matches
its name, the highest priority, and between equal priorities the name that sorts first.
The queue's *effective* settings are its declared ones with that policy's definition
merged in by RabbitMQ's rules (:func:`effective`): for ``max-length``,
``message-ttl`` and ``delivery-limit`` the lower of the two values; for the other keys
the declare's own value wins where the declare gave one.

Policies are replicated (``SetPolicy`` / ``ClearPolicy`` on the log) and applied in log
order, to every queue that exists and to each queue declared later, so every replica
computes the same effective settings. A queue's snapshot keeps its *declared* settings;
the effective ones are derived again from the policies after a restore
(:meth:`Policies.apply_all`), so the digest covers them through the policy table.

Patterns are Python :mod:`re` expressions, searched (not anchored, as RabbitMQ's), each
compiled once per policy. Since every replica must match in bounded time, a pattern is
refused when it is longer than :data:`MAX_PATTERN` characters or has, inside an
unbounded repetition, a repetition of varying length or an ambiguous alternation
(``(a+)+``, ``(a*)*b``, ``(a|aa)+``: the shapes whose backtracking grows exponentially),
and names are at most 255 bytes.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import DEFAULT_DELIVERY_LIMIT, OVERFLOW_POLICIES, ClearPolicy, SetPolicy
from batonmq.cluster.exchanges import check_exchange_name
from batonmq.cluster.queue_state import POLICY_FIELDS, RETRY_POLICIES, QueueState
from batonmq.cluster.results import PolicyChanged

__all__ = [
    "APPLY_TO",
    "KEYS",
    "MAX_PATTERN",
    "MAX_PRIORITY",
    "Policy",
    "Policies",
    "check_definition",
    "check_pattern",
    "check_policy_name",
    "effective",
    "make_policy",
]

#: What a policy may apply to. Baton's exchanges take no policy keys, so ``all`` applies
#: to the queues alone, as ``queues`` does.
APPLY_TO: Final = ("queues", "all")
#: The definition keys and what each takes (docs/operations.md "Policies").
KEYS: Final = (
    "max-length",
    "overflow",
    "message-ttl",
    "delivery-limit",
    "dead-letter",
    "dead-letter-exchange",
    "dead-letter-routing-key",
    "retry",
)
#: The longest pattern, in characters.
MAX_PATTERN: Final = 255
#: The highest priority (0 is the lowest).
MAX_PRIORITY: Final = 2**31 - 1
#: The largest number a definition takes (ms or messages).
_MAX_INT: Final = 2**53
_RETRY_KEYS: Final = ("policy", "delay", "max")

# Python's own parser of regular expressions (the one re.compile uses), for the nesting
# check; loaded by name since the stdlib's typing does not describe it.
_parser: Any = importlib.import_module("re._parser")


def check_policy_name(name: Any) -> str:
    """``name`` if it can be a policy's name: 1 to 255 UTF-8 bytes, no control characters.

    Raises:
        InvalidArgument: it cannot.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgument("a policy name must not be empty")
    if len(name.encode("utf-8", "surrogatepass")) > 255 or not name.isprintable():
        raise InvalidArgument(
            f"policy name {name[:40]!r} is longer than 255 bytes or has control characters"
        )
    return name


_REPEATS: Final = (_parser.MAX_REPEAT, _parser.MIN_REPEAT, _parser.POSSESSIVE_REPEAT)


def _ambiguous_branch(alternatives: list[Any]) -> bool:
    """Whether alternatives could match one text in two ways: one is empty, or does not
    start with a literal character, or two start with the same one (the parser factors
    a common prefix out, so ``ab|abc`` arrives as ``ab(?:|c)``)."""
    firsts: set[int] = set()
    for alt in alternatives:
        if not alt or alt[0][0] is not _parser.LITERAL or alt[0][1] in firsts:
            return True
        firsts.add(alt[0][1])
    return False


def _backtracks(items: Iterable[Any], inside: bool) -> bool:
    """Whether a parsed pattern has, inside an unbounded repetition, something that can
    match the same text in more than one way: a repetition of varying length (``(a+)+``,
    ``(aa?)*``) or an ambiguous alternation (``(a|aa)+``): the shapes whose backtracking
    grows exponentially with the name's length."""
    for op, av in items:
        if op in _REPEATS:
            low, high, body = av
            if inside and low != high:
                return True
            if _backtracks(body, inside or high == _parser.MAXREPEAT or high > 100):
                return True
        elif op is _parser.SUBPATTERN:
            if _backtracks(av[-1], inside):
                return True
        elif op is _parser.ATOMIC_GROUP:
            if _backtracks(av, inside):
                return True
        elif op is _parser.BRANCH:
            if inside and _ambiguous_branch(av[1]):
                return True
            if any(_backtracks(alt, inside) for alt in av[1]):
                return True
        elif op in (_parser.ASSERT, _parser.ASSERT_NOT):
            if _backtracks(av[1], inside):
                return True
        elif op is _parser.GROUPREF_EXISTS:
            if any(_backtracks(alt, inside) for alt in av[1:] if alt is not None):
                return True
    return False


def check_pattern(pattern: Any) -> re.Pattern[str]:
    """``pattern`` compiled, if it may be a policy's pattern.

    Raises:
        InvalidArgument: not a string, empty, longer than :data:`MAX_PATTERN`, not a
            valid expression, or one with a repetition nested in another.
    """
    if not isinstance(pattern, str) or not pattern:
        raise InvalidArgument("a policy pattern must be a non-empty regular expression")
    if len(pattern) > MAX_PATTERN:
        raise InvalidArgument(f"a policy pattern is at most {MAX_PATTERN} characters")
    try:
        parsed = _parser.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InvalidArgument(f"bad policy pattern {pattern[:60]!r}: {exc}") from exc
    if _backtracks(parsed, False):
        raise InvalidArgument(
            f"policy pattern {pattern[:60]!r} nests a repetition inside another (such as"
            " '(a+)+' or '(a|aa)+'), which can take exponential time to match: write it"
            " without"
        )
    return compiled


def _int(key: str, value: Any, low: int = 1) -> int:
    if type(value) is not int or not low <= value <= _MAX_INT:
        raise InvalidArgument(f"policy key {key!r} must be an integer of {low} or more, not {value!r}")
    return value


def _str(key: str, value: Any) -> str:
    if not isinstance(value, str) or len(value.encode("utf-8", "surrogatepass")) > 255:
        raise InvalidArgument(f"policy key {key!r} must be a string of at most 255 bytes")
    return value


def _retry(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgument(
            "policy key 'retry' must be a map: {\"policy\": \"fixed\" | \"linear\" |"
            " \"exponential\", \"delay\": ms, \"max\": ms (optional)}"
        )
    unknown = sorted(str(k) for k in value if k not in _RETRY_KEYS)
    if unknown:
        raise InvalidArgument(f"unknown retry key {unknown[0]!r} (keys: {', '.join(_RETRY_KEYS)})")
    policy = value.get("policy")
    if policy not in RETRY_POLICIES:
        raise InvalidArgument(f"retry policy must be one of {', '.join(RETRY_POLICIES)}, not {policy!r}")
    delay = _int("retry.delay", value.get("delay"))
    out: dict[str, Any] = {"policy": policy, "delay": delay}
    if value.get("max") is not None:
        out["max"] = _int("retry.max", value.get("max"))
        if out["max"] < delay:
            raise InvalidArgument("retry max must not be below its delay")
    return out


def check_definition(raw: Any) -> tuple[tuple[str, Any], ...]:
    """A policy's definition, checked and in canonical form (sorted ``(key, value)``
    pairs; a retry's value a map in a fixed key order).

    Raises:
        InvalidArgument: not a map, empty, an unknown key, a value of the wrong type or
            range, or keys that exclude each other.
    """
    if not isinstance(raw, Mapping) or not raw:
        raise InvalidArgument("a policy definition must be a non-empty map of keys to values")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in KEYS:
            raise InvalidArgument(f"unknown policy key {str(key)[:40]!r} (keys: {', '.join(KEYS)})")
        if key in ("max-length", "message-ttl", "delivery-limit"):
            out[key] = _int(key, value)
        elif key == "overflow":
            if value not in OVERFLOW_POLICIES:
                raise InvalidArgument(
                    f"policy key 'overflow' must be one of {', '.join(OVERFLOW_POLICIES)}, not {value!r}"
                )
            out[key] = value
        elif key == "retry":
            out[key] = _retry(value)
        else:
            out[key] = _str(key, value)
    if "dead-letter" in out:
        if not out["dead-letter"]:
            raise InvalidArgument("policy key 'dead-letter' must name a queue")
        if "dead-letter-exchange" in out or "dead-letter-routing-key" in out:
            raise InvalidArgument("a policy names a dead-letter queue or a dead-letter exchange, not both")
    if out.get("dead-letter-exchange"):  # "" is the default exchange
        check_exchange_name(out["dead-letter-exchange"])
    if "dead-letter-routing-key" in out and "dead-letter-exchange" not in out:
        raise InvalidArgument("policy key 'dead-letter-routing-key' needs 'dead-letter-exchange'")
    return tuple(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class Policy:
    """One policy, checked (:func:`make_policy`), its pattern compiled once."""

    name: str
    pattern: str
    apply_to: str
    definition: tuple[tuple[str, Any], ...]
    priority: int
    regex: re.Pattern[str] = field(compare=False, repr=False)

    def matches(self, queue: str) -> bool:
        """Whether the policy's pattern is found in the queue's name."""
        return self.regex.search(queue) is not None

    def describe(self) -> dict[str, Any]:
        """What ``baton policy list`` and the admin API show."""
        return {"name": self.name, "pattern": self.pattern, "apply_to": self.apply_to,
                "definition": dict(self.definition), "priority": self.priority}

    def snapshot(self) -> list[Any]:
        return [self.name, self.pattern, self.apply_to, [list(kv) for kv in self.definition],
                self.priority]


def make_policy(
    name: Any, pattern: Any, apply_to: Any, definition: Any, priority: Any
) -> Policy:
    """A policy from its parts, each checked.

    Raises:
        InvalidArgument: a bad name, pattern, apply-to, definition or priority.
    """
    check_policy_name(name)
    regex = check_pattern(pattern)
    if apply_to not in APPLY_TO:
        raise InvalidArgument(f"apply-to must be one of {', '.join(APPLY_TO)}, not {apply_to!r}")
    if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:
        raise InvalidArgument(f"a policy priority must be an integer from 0 to {MAX_PRIORITY}")
    return Policy(name, pattern, apply_to, check_definition(definition), priority, regex)


def _lower(declared: int | None, given: int) -> int:
    return given if declared is None else min(declared, given)


def effective(declared: Mapping[str, Any], queue: str, definition: Mapping[str, Any]) -> dict[str, Any]:
    """A queue's effective settings (:data:`POLICY_FIELDS`): its ``declared`` ones with a
    policy's ``definition`` merged in, by RabbitMQ's rules (docs/operations.md
    "Policies").

    * ``max-length``, ``message-ttl``, ``delivery-limit``: the lower of the declare's and
      the policy's value (a declare that kept the default delivery limit, 20, counts as
      not giving one);
    * ``overflow``: the policy's, unless the declare gave ``drop-head``;
    * ``dead-letter``, ``dead-letter-exchange``, ``dead-letter-routing-key``: the
      policy's, unless the declare named a dead-letter queue or exchange (then all of
      the declare's); a queue is never its own dead-letter queue (the key is skipped);
    * ``retry``: the policy's, unless the declare gave a retry policy.
    """
    out = dict(declared)
    d = definition
    if "max-length" in d:
        out["max_length"] = _lower(declared["max_length"], d["max-length"])
    if "message-ttl" in d:
        out["message_ttl_ms"] = _lower(declared["message_ttl_ms"], d["message-ttl"])
    if "delivery-limit" in d:
        given = declared["delivery_limit"]
        out["delivery_limit"] = _lower(None if given == DEFAULT_DELIVERY_LIMIT else given,
                                       d["delivery-limit"])
    if "overflow" in d and declared["overflow"] == OVERFLOW_POLICIES[0]:
        out["overflow"] = d["overflow"]
    if declared["dead_letter"] is None and declared["dead_letter_exchange"] is None:
        if "dead-letter" in d and d["dead-letter"] != queue:
            out["dead_letter"] = d["dead-letter"]
        elif "dead-letter-exchange" in d:
            out["dead_letter_exchange"] = d["dead-letter-exchange"]
            out["dead_letter_routing_key"] = d.get("dead-letter-routing-key")
    if "retry" in d and not declared["retry"]:
        retry = d["retry"]
        out["retry"] = retry["policy"]
        out["retry_delay_ms"] = retry["delay"]
        out["retry_max_ms"] = retry.get("max")
    return out


class Policies:
    """The replicated policy table (flag ``policies``)."""

    __slots__ = ("_by_name", "_order", "version")

    def __init__(self) -> None:
        self._by_name: dict[str, Policy] = {}
        self._order: list[Policy] = []  # by priority (highest first), then name
        self.version = 0  # bumped by every change

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> Policy | None:
        return self._by_name.get(name)

    def listed(self) -> list[Policy]:
        """Every policy, by name."""
        return [self._by_name[n] for n in sorted(self._by_name)]

    def _changed(self) -> None:
        self.version += 1
        self._order = sorted(self._by_name.values(), key=lambda p: (-p.priority, p.name))

    def put(self, policy: Policy) -> bool:
        """Add or replace ``policy``; returns whether it is new."""
        new = policy.name not in self._by_name
        self._by_name[policy.name] = policy
        self._changed()
        return new

    def clear(self, name: str) -> bool:
        """Remove policy ``name``; returns whether it existed."""
        if self._by_name.pop(name, None) is None:
            return False
        self._changed()
        return True

    def for_queue(self, queue: str) -> Policy | None:
        """The policy that applies to queue ``queue``, or None."""
        for policy in self._order:
            if policy.matches(queue):
                return policy
        return None

    def apply(self, q: QueueState) -> None:
        """Set ``q``'s effective settings and its ``policy`` from the table."""
        policy = self.for_queue(q.name) if self._order else None
        if policy is None and q.policy is None:
            return
        base = q.declared_settings()
        eff = effective(base, q.name, dict(policy.definition)) if policy is not None else base
        for name in POLICY_FIELDS:
            setattr(q, name, eff[name])
        q.declared = base if policy is not None else None
        q.policy = policy.name if policy is not None else None

    def apply_all(self, queues: Iterable[QueueState]) -> int:
        """:meth:`apply` to each queue; returns how many have a policy now."""
        n = 0
        for q in queues:
            self.apply(q)
            n += q.policy is not None
        return n

    def apply_event(self, ev: SetPolicy | ClearPolicy, queues: Iterable[QueueState]) -> PolicyChanged:
        """Apply a SetPolicy or ClearPolicy (checked first: a bad one changes nothing),
        then every queue's effective settings again, in log order.

        Raises:
            InvalidArgument: a bad policy (a forged record; the broker checks first).
        """
        if isinstance(ev, SetPolicy):
            policy = make_policy(ev.name, ev.pattern, ev.apply_to, dict(ev.definition), ev.priority)
            changed = self.put(policy)
        else:
            check_policy_name(ev.name)
            changed = self.clear(ev.name)
        return PolicyChanged(changed=changed, queues=self.apply_all(queues))

    # -- persistence ---------------------------------------------------------------

    def snapshot(self) -> list[Any] | None:
        """Canonical; None while there is no policy (so the snapshot keeps its shape)."""
        if not self._by_name:
            return None
        return [p.snapshot() for p in self.listed()]

    def restore(self, snap: list[Any] | None) -> None:
        self._by_name = {}
        for name, pattern, apply_to, definition, priority in snap or ():
            self._by_name[name] = make_policy(
                name, pattern, apply_to, {k: v for k, v in definition}, priority
            )
        self._changed()
