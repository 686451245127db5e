"""``python -m tests.integration.older_build ARGS`` runs ``baton ARGS`` as an older build
would: one that lacks the feature flag ``exchange_bindings`` (:data:`LACKING`). A
cluster it makes never enables that flag, so after a restart on this build the flag is
off until an operator enables it: the state a rolling upgrade from 0.3.0 is in
(docs/operations.md "Upgrading")."""

from __future__ import annotations

import sys

from batonmq.cluster.features import FEATURES

LACKING = "exchange_bindings"
MODULE = "tests.integration.older_build"


def main() -> int:
    # The one table of flags (cluster/features.py), before any broker code reads it.
    del FEATURES[LACKING]
    from batonmq.broker.cli import main as baton

    return baton()


if __name__ == "__main__":
    sys.exit(main())
