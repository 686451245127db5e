"""Print the message life-cycle diagram (Mermaid) built from cluster.queues.TRANSITIONS.

    python docs/gen_transitions.py                       # print the block
    python docs/gen_transitions.py --check docs/events.md  # exit 1 if the doc is stale

The block lives in docs/events.md between the markers below; after changing
TRANSITIONS, run this script and paste its output between them.
"""

from __future__ import annotations

import argparse
import os
import sys

BEGIN = "<!-- transitions:begin -->"
END = "<!-- transitions:end -->"


def generate() -> str:
    """The Mermaid block (with its ``` fences) for cluster.queues.TRANSITIONS."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    from batonmq.cluster.queues import TRANSITIONS

    lines = ["```mermaid", "stateDiagram-v2"]
    for (src, op), dst in TRANSITIONS.items():
        a = "[*]" if src is None else src.name
        lines.append(f"    {a} --> {dst.name}: {op}")
    lines.append("```")
    return "\n".join(lines)


def embedded(text: str) -> str | None:
    """The text between the markers in ``text`` (stripped), or None without markers."""
    start = text.find(BEGIN)
    end = text.find(END, start + len(BEGIN)) if start >= 0 else -1
    if start < 0 or end < 0:
        return None
    return text[start + len(BEGIN) : end].strip()


def check(path: str) -> str | None:
    """None if the block in ``path`` matches :func:`generate`, else what is wrong."""
    with open(path, encoding="utf-8") as f:
        found = embedded(f.read())
    if found is None:
        return f"{path}: markers {BEGIN} ... {END} not found"
    if found != generate():
        return (
            f"{path}: the transitions diagram is stale; run "
            f"`python docs/gen_transitions.py` and paste its output between the markers"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", metavar="DOC", help="compare the block embedded in DOC")
    args = p.parse_args(argv)
    if args.check:
        problem = check(args.check)
        if problem:
            print(problem, file=sys.stderr)
            return 1
        return 0
    print(generate())
    return 0


if __name__ == "__main__":
    sys.exit(main())
