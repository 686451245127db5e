"""``baton partitions list`` and ``baton partitions add --count M``: a split cluster's data
partitions, and growing their number while it serves (docs/operations.md "Growing N").

``add`` asks one broker (an admin's command), which grows the log and records the new
count on the control partition; every broker then opens the new partitions. New queues
go to the new partitions (the emptiest); existing queues stay where they are. ``--count``
is the number the cluster is to have, not how many to add, so running the command
again changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys

from batonmq.broker.cli_ops import BROKER_HELP, open_broker
from batonmq.cluster.errors import InvalidArgument

__all__ = ["add_commands"]


def _list(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        topo = conn.topology()
    rows = topo.get("partitions")
    if rows is None:
        raise InvalidArgument(
            "this cluster's log is one partition (started without --partitions N > 1)"
        )
    if args.json:
        print(json.dumps({"count": topo.get("partition_count", len(rows)), "partitions": rows,
                          "groups": topo.get("groups", [])}, indent=2))
        return 0
    groups = {g["partition"]: g for g in topo.get("groups") or []}
    print(f"{'partition':>9}  {'queues':>6}  {'applied':>8}  {'lag':>7}  {'view':>4}"
          f"  {'member':6}  {'leader':26}  replicas")
    here = {r["partition"]: r for r in rows}
    for k in sorted({*here, *groups}):
        group = _group(groups.get(k, {}))
        r = here.get(k)
        if r is None:  # (replica groups: applied by other brokers)
            print(f"{k:>9}  {'-':>6}  {'-':>8}  {'-':>7}  {'-':>4}  {'-':6}"
                  f"  {'(not applied here)':26}  {group}")
            continue
        lag = "?" if r.get("lag") is None else r["lag"]  # its log's end unknown
        print(f"{k:>9}  {r['queues']:>6}  {r['applied']:>8}  {lag:>7}  {r['view']:>4}"
              f"  {'yes' if r['member'] else 'no':6}  {r['leader'] or '-':26}  {group}")
    count = topo.get("partition_count", len(rows))
    print(f"{count} data partition(s); this broker applies {len(rows)}")
    if count > len(rows) and topo.get("status") != "ok":
        print(f"not open here yet: {topo.get('status')}")
    return 0


def _group(row: dict[str, object]) -> str:
    """A partition's replica group as one cell: its brokers, live of all, joining."""
    replicas = row.get("replicas")
    if not isinstance(replicas, list):
        return "every broker"  # (no group: before the flag replica_groups)
    cell = f"{','.join(map(str, replicas))} ({row.get('live_replicas')}/{len(replicas)} live)"
    joining = row.get("joining")
    if isinstance(joining, list) and joining:
        cell += f" joining {','.join(map(str, joining))}"
    return cell


def _add(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        grown = conn.grow_partitions(args.count)
    if grown.count == grown.before:
        print(f"the cluster has {grown.count} data partitions already: nothing changed",
              file=sys.stderr)
        return 0
    started = grown.started or []
    new = list(range(grown.before + 1, grown.count + 1))
    print(f"grew the cluster from {grown.before} to {grown.count} data partitions; new"
          " queues go to the new ones, existing queues stay where they are", file=sys.stderr)
    if len(started) < len(new):
        waiting = ", ".join(str(k) for k in new if k not in started)
        print(f"the broker asked has not opened partition(s) {waiting} yet: see"
              " 'baton partitions list' and its log", file=sys.stderr)
    return 0


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Add ``partitions`` to the ``baton`` parser's subcommands."""
    p = sub.add_parser("partitions", help="a cluster's data partitions: list them, or add"
                                          " more while it serves (docs/operations.md)")
    ps = p.add_subparsers(dest="partitions_command", required=True)
    ls = ps.add_parser("list", help="each data partition as the broker asked applies it")
    ls.add_argument("--broker", default=None, help=BROKER_HELP)
    ls.add_argument("--json", action="store_true", help="the count and the rows as JSON")
    ls.set_defaults(func=_list)
    add = ps.add_parser(
        "add", help="grow the cluster to COUNT data partitions (admin): new queues go to"
                    " the new ones, existing queues do not move; never shrinks")
    add.add_argument("--count", type=int, required=True, metavar="COUNT",
                     help="the number of data partitions the cluster is to have (more than"
                          " it has; as many: nothing changes)")
    add.add_argument("--broker", default=None, help=BROKER_HELP)
    add.set_defaults(func=_add)
