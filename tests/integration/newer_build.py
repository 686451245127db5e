"""``python -m tests.integration.newer_build ARGS`` runs ``baton ARGS`` as a newer build
would: one that knows a feature flag this build does not (:data:`NEWER_FLAG`, of this
build's format, so it writes nothing else). With it, tests run a rolling upgrade's flags
on real processes: a broker of this build beside one of the "newer" build lacks that
flag (docs/operations.md "Upgrading")."""

from __future__ import annotations

import sys

from batonmq.cluster.features import FEATURES, MAX_FORMAT, Feature

NEWER_FLAG = "newer_build_flag"
MODULE = "tests.integration.newer_build"


def main() -> int:
    # The one table of flags (cluster/features.py), before any broker code reads it.
    FEATURES[NEWER_FLAG] = Feature(
        NEWER_FLAG, MAX_FORMAT, "9.9.9", "what a newer build changes (a test's stand-in)"
    )
    from batonmq.broker.cli import main as baton

    return baton()


if __name__ == "__main__":
    sys.exit(main())
