"""``baton feature list`` and ``baton feature enable``: a cluster's feature flags, read
and enabled over a broker's client port (docs/operations.md "Upgrading").

Both ask one broker, which answers from the state it applied: the flags its build knows
(and any a newer build enabled), each with its state and which live members support it.
Enabling is for an admin, and is refused, with the members that lack a flag named, until
every live member's build has it (broker/features.py checks first, the log's order
decides).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from batonmq.broker.cli_ops import BROKER_HELP, open_broker
from batonmq.cluster.errors import InvalidArgument

__all__ = ["add_commands", "cluster_format", "feature_table", "member_names"]

_HEADER = ("feature", "state", "format", "since", "supported by", "not supported by")


def member_names(keys: Sequence[str], addresses: Mapping[str, str]) -> dict[str, str]:
    """How each member key (``node/runtime``) is shown: its node id, with the start of
    its runtime id when two live runtimes share that node id (a restart not yet
    dropped), and its address when ``addresses`` has it."""
    nodes = [k.partition("/")[0] for k in keys]
    out = {}
    for key, node in zip(keys, nodes):
        name = node if nodes.count(node) == 1 else f"{node}/{key.partition('/')[2][:8]}"
        addr = addresses.get(key, "")
        out[key] = f"{name} ({addr})" if addr else name
    return out


def cluster_format(rows: Sequence[Mapping[str, Any]], more: Sequence[str] = ()) -> int:
    """The cluster's format from ``baton feature list`` rows: the highest format of its
    enabled flags (and of ``more``, flags just enabled); 1 when none is enabled. A flag a
    newer build enabled counts as 0: the broker asked cannot say (cluster/features.py
    likewise)."""
    on = [int(r["format"]) for r in rows if r["state"] == "enabled" or r["name"] in more]
    return max([1, *on])


def feature_table(
    rows: Sequence[Mapping[str, Any]], addresses: Mapping[str, str] | None = None
) -> list[str]:
    """The lines of ``baton feature list``: one row a flag, the columns as wide as their
    widest cell; members by node id, and those that lack a flag with their address (who
    to upgrade)."""
    keys = list(dict.fromkeys(
        k for r in rows for k in [*r["supported_by"], *r["unsupported_by"]]
    ))
    names = member_names(keys, {})
    located = member_names(keys, addresses or {})
    cells = [_HEADER]
    for r in rows:
        known = r["state"] != "unknown"
        cells.append((
            r["name"],
            r["state"],
            str(r["format"]) if known else "?",
            r["since"] or "-",
            ", ".join(names[k] for k in r["supported_by"]) or "-",
            ", ".join(located[k] for k in r["unsupported_by"]) or "-",
        ))
    widths = [max(len(row[i]) for row in cells) for i in range(len(_HEADER) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in cells
    ]
    return [line.rstrip() for line in lines]


def _list(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        rows = conn.list_features()
        addresses = _addresses(conn.topology()) if not args.json else {}
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for line in feature_table(rows, addresses):
        print(line)
    enabled = sum(1 for r in rows if r["state"] == "enabled")
    print(f"cluster format {cluster_format(rows)}; {enabled} of {len(rows)} flag(s) enabled")
    if any(r["state"] == "unknown" for r in rows):
        print("unknown: enabled by a newer build than this broker's; upgrade this broker")
    if any(r["state"] == "disabled" for r in rows):
        print("enable with: baton feature enable NAME (for good: no downgrade past it)")
    return 0


def _enable(args: argparse.Namespace) -> int:
    if args.all == bool(args.names):
        raise InvalidArgument("name the feature flag(s) to enable, or give --all (not both)")
    with open_broker(args) as conn:
        before = conn.list_features()
        enabled = conn.enable_features(None if args.all else list(args.names))
    was = {r["name"] for r in before if r["state"] == "enabled"}
    asked = [r["name"] for r in before if r["state"] != "unknown"] if args.all else args.names
    already = [n for n in dict.fromkeys(asked) if n in was and n not in enabled]
    fmt = cluster_format(before, enabled)
    if enabled:
        print(f"enabled feature flag(s) {', '.join(enabled)}; the cluster's format is {fmt}")
    if already:
        print(f"already enabled: {', '.join(already)}")
    if not enabled and not already:  # e.g. --all on a build that knows no flag
        print("nothing to enable")
    return 0


def _addresses(topology: Mapping[str, Any]) -> dict[str, str]:
    """Member key -> address, from a Topology answer (empty addresses for a non-admin)."""
    return {
        f"{i['node_id']}/{i['runtime']}": i["address"]
        for i in topology.get("instances", []) if i.get("address")
    }


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``feature list`` and ``feature enable`` to the ``baton`` parser's subcommands."""
    f = sub.add_parser("feature", help="list or enable the cluster's feature flags")
    fs = f.add_subparsers(dest="feature_command", required=True)
    ls = fs.add_parser("list", help="each flag: enabled or not, its format, which live"
                                    " members support it")
    ls.add_argument("--broker", default=None, help=BROKER_HELP)
    ls.add_argument("--json", action="store_true", help="the broker's rows as JSON")
    ls.set_defaults(func=_list)
    en = fs.add_parser("enable", help="enable flags for good (admin); refused while a live"
                                      " member lacks one")
    en.add_argument("names", nargs="*", metavar="NAME", help="the flag(s) to enable")
    en.add_argument("--all", action="store_true",
                    help="every flag the broker's build knows")
    en.add_argument("--broker", default=None, help=BROKER_HELP)
    en.set_defaults(func=_enable)
