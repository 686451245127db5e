"""The client's error classes: the same objects as :mod:`batonmq.cluster.errors`.

Every layer — the client, the broker, the replicated core and the store — raises the same
classes, and the receiving side of the wire rebuilds them by code with :func:`for_code`.
They are defined in the core's leaf module so that the pure core imports nothing of the
client; this module gives them to users under the client's name (``clients.errors``, and
each class directly as ``clients.QueueFull`` and so on).
"""

from __future__ import annotations

from batonmq.cluster.errors import *  # noqa: F403 (the same classes, by design)
from batonmq.cluster.errors import __all__ as __all__
