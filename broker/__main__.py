"""``python -m batonmq.broker`` is the ``baton`` command."""

import sys

from batonmq.broker.cli import main

sys.exit(main())
