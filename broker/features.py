"""Feature flags for operators: what ``baton feature list`` shows and what ``baton feature
enable`` appends (docs/operations.md "Upgrading", cluster/features.py).

Both read the state this broker applied. Enabling is checked here first, so that an
operator hears at once which member lacks a flag instead of a refusal from the log; the
state checks again when it applies the event, in log order, which is what makes it safe.
"""

from __future__ import annotations

from typing import Any

from batonmq.cluster.errors import InvalidArgument
from batonmq.cluster.events import EnableFeatures
from batonmq.cluster.features import FEATURES
from batonmq.cluster.results import FeatureList
from batonmq.cluster.state import State

__all__ = ["feature_list", "enable_event", "feature_rows"]


def feature_rows(state: State) -> list[dict[str, Any]]:
    """Every flag this build knows or the cluster has enabled, in the order they were
    added (unknown ones last), with its state and which live members support it."""
    live = state.live_runtimes()
    rows = []
    names = list(FEATURES) + state.features.unknown()
    for name in names:
        f = FEATURES.get(name)
        supported = [k for k in live if name in (state.supported(k) or ())]
        rows.append({
            "name": name,
            "state": ("enabled" if name in state.features.enabled else "disabled")
            if f is not None else "unknown",
            "format": f.format if f is not None else 0,
            "since": f.since if f is not None else "",
            "doc": f.doc if f is not None else "enabled by a newer build",
            "enabled_at": state.features.enabled.get(name, -1),
            "supported_by": supported,
            "unsupported_by": [k for k in live if k not in supported],
        })
    return rows


def feature_list(state: State) -> FeatureList:
    """The ListFeatures answer."""
    return FeatureList(features=feature_rows(state), format=state.features.format)


def enable_event(state: State, names: Any) -> EnableFeatures:
    """The event that enables ``names`` (None: every flag this build knows).

    Raises:
        InvalidArgument: a name that is not a flag, or a live member that does not
            support one (named, with what it lacks).
    """
    if names is None:
        wanted = list(FEATURES)
    elif isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        wanted = list(dict.fromkeys(names))
    else:
        raise InvalidArgument("names must be a non-empty list of feature flag names")
    unknown = [n for n in wanted if n not in FEATURES]
    if unknown:
        raise InvalidArgument(
            f"unknown feature flag(s) {', '.join(unknown)}; this broker's build knows"
            f" {', '.join(FEATURES)}"
        )
    lacking = []
    for key in state.live_runtimes():
        have = state.supported(key)
        missing = [n for n in wanted if n not in (have or ())]
        if missing:
            addr = state.membership.known[key].address if key in state.membership.known else ""
            who = f"{key} ({addr})" if addr else key
            lacking.append(
                f"{who} runs a build from before feature flags" if have is None
                else f"{who} lacks {', '.join(missing)}"
            )
    if lacking:
        raise InvalidArgument(
            "cannot enable feature flags until every member supports them: "
            + "; ".join(lacking) + ". Upgrade those brokers first (docs/operations.md"
            " \"Upgrading\")"
        )
    return EnableFeatures(tuple(wanted))
