"""``baton partitions list`` and ``baton partitions add --count M``: a split cluster's data
partitions, and growing their number while it serves (docs/operations.md "Growing N").
``move``, ``rebalance`` and ``replicas``: operating replica groups (docs/operations.md
"Replica groups"), each an admin's command checked and appended by the broker asked.

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
import time
from typing import Any

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
    leaving = row.get("leaving")
    if isinstance(leaving, list) and leaving:  # (a move: they go once the joining are ready)
        cell += f" leaving {','.join(map(str, leaving))}"
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
        print(f"the broker asked does not apply partition(s) {waiting} (not open there"
              " yet, or given to replica groups without it): see 'baton partitions list'",
              file=sys.stderr)
    return 0


def _move(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        if args.wait and args.timeout <= 0:
            raise InvalidArgument(f"--timeout is a number of seconds above 0, not {args.timeout}")
        conn.move_partition(args.partition, args.source, args.target)
        print(f"moving data partition {args.partition} from {args.source} to {args.target}:"
              f" {args.target} joins its group and catches up, then {args.source} leaves"
              f" it and deletes its copy ('baton partitions list' shows the progress)",
              file=sys.stderr)
        if not args.wait:
            return 0
        deadline = time.monotonic() + args.timeout
        said = ""
        while True:
            row = _group_row(conn.topology(), args.partition)
            state = _move_state(row, args.source, args.target)
            if state == "done":
                print(f"data partition {args.partition} moved: its replicas are"
                      f" {','.join(row.get('replicas') or [])}", file=sys.stderr)
                return 0
            if state != said:
                print(f"  {state}", file=sys.stderr)
                said = state
            if time.monotonic() >= deadline:
                print(f"data partition {args.partition} not moved after {args.timeout:g} s"
                      f" ({state}): see 'baton partitions list' and the brokers' logs",
                      file=sys.stderr)
                return 1
            time.sleep(0.5)


def _group_row(topo: dict[str, Any], partition: int) -> dict[str, Any]:
    for row in topo.get("groups") or []:
        if row.get("partition") == partition:
            return dict(row)
    return {}


def _move_state(row: dict[str, Any], source: str, target: str) -> str:
    """Where a move stands, as one phrase ("done" once it finished)."""
    replicas, joining = row.get("replicas") or [], row.get("joining") or []
    if target in joining:
        return f"{target} is catching up ({source} still serves)"
    if target in replicas and source not in replicas:
        return "done"
    if target in replicas:
        return f"{target} is a replica; {source} is leaving"
    return f"{target} is not in the group any more (the move was undone: see the logs)"


def _rebalance(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        done = conn.rebalance_partitions(dry_run=args.dry_run)
    if not done.moves:
        print("the partitions are balanced: nothing to move", file=sys.stderr)
        return 0
    verb = "would move" if args.dry_run else "moving"
    for m in done.moves:
        print(f"{verb} data partition {m['partition']} from {m['from']} to {m['to']}")
    if not args.dry_run:
        print("each target catches up, then its source leaves and deletes its copy; run"
              " the command again once they are done to move more", file=sys.stderr)
    return 0


def _replicas(args: argparse.Namespace) -> int:
    with open_broker(args) as conn:
        done = conn.set_replicas(args.replicas)
    before = done.before or "every broker"
    print(f"replica groups of {done.replicas} broker(s) (were {before}): the control"
          " leader's planner adds replicas to smaller groups and trims larger ones"
          " ('baton partitions list' shows them)", file=sys.stderr)
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
    mv = ps.add_parser(
        "move", help="move a data partition's replica from one broker to another (admin):"
                     " the target catches up, then the source leaves and deletes its copy")
    mv.add_argument("partition", type=int, metavar="P", help="the data partition")
    mv.add_argument("--from", dest="source", required=True, metavar="NODE",
                    help="the node id of one of its replicas")
    mv.add_argument("--to", dest="target", required=True, metavar="NODE",
                    help="the node id of a live broker not in its group")
    mv.add_argument("--wait", action="store_true", help="wait until the move is done,"
                                                        " saying how it goes")
    mv.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                    help="with --wait: give up after this long (default 300)")
    mv.add_argument("--broker", default=None, help=BROKER_HELP)
    mv.set_defaults(func=_move)
    rb = ps.add_parser(
        "rebalance", help="even out the data partitions each live broker holds (admin):"
                          " a bounded number of moves at a time")
    rb.add_argument("--dry-run", action="store_true", help="print the moves only")
    rb.add_argument("--broker", default=None, help=BROKER_HELP)
    rb.set_defaults(func=_rebalance)
    rp = ps.add_parser(
        "replicas", help="set how many brokers each data partition's group has (admin)")
    rp.add_argument("replicas", type=int, metavar="R", help="1 to 15")
    rp.add_argument("--broker", default=None, help=BROKER_HELP)
    rp.set_defaults(func=_replicas)
