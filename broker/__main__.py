"""``python -m batonmq.broker`` is the ``baton`` command."""

import sys

from batonmq.broker.entry import main

sys.exit(main())
