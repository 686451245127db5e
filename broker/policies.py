"""What a broker checks of a policy command before it goes to the log, shared by the
native protocol (broker/session.py) and the admin API (broker/admin_policies.py): the
flag ``policies``, then the policy itself (cluster/policies.py), so that a bad one is
answered with one clear line and nothing is written (docs/operations.md "Policies")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batonmq.cluster import events
from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.policies import check_policy_name, make_policy
from batonmq.cluster.results import PolicyList

if TYPE_CHECKING:
    from batonmq.cluster.state import State

__all__ = ["set_policy_event", "clear_policy_event", "list_policies"]


def _need_flag(state: State) -> None:
    if "policies" not in state.features.enabled:
        raise InvalidArgument(
            "policies need the feature flag policies: enable it once every broker runs a"
            " build that has it (baton feature enable policies)"
        )


def set_policy_event(
    state: State, name: Any, pattern: Any, apply_to: Any, definition: Any, priority: Any
) -> events.SetPolicy:
    """The event that adds or replaces a policy, checked before it goes to the log.

    Raises:
        InvalidArgument: the flag ``policies`` is not enabled, or a bad name, pattern,
            apply-to, definition or priority.
    """
    _need_flag(state)
    policy = make_policy(name, pattern, apply_to, definition, priority)
    return events.SetPolicy(policy.name, policy.pattern, policy.apply_to, policy.definition,
                            policy.priority)


def clear_policy_event(state: State, name: Any) -> events.ClearPolicy:
    """The event that removes a policy.

    Raises:
        InvalidArgument: the flag ``policies`` is not enabled, a bad name, or no such
            policy.
    """
    _need_flag(state)
    check_policy_name(name)
    if state.policies.get(name) is None:
        raise InvalidArgument(f"no policy {name!r}")
    return events.ClearPolicy(name)


def list_policies(state: State) -> PolicyList:
    """Every policy, by name."""
    return PolicyList([p.describe() for p in state.policies.listed()])
