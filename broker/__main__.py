"""``python -m broker`` is the ``baton`` command."""

import sys

from broker.cli import main

sys.exit(main())
