"""Fixtures shared by every test tier."""

from __future__ import annotations

import os
import tempfile

from tests.kafka_fixture import kafka_session_dir, kafka_bootstrap, kafka_sasl

__all__ = ["kafka_session_dir", "kafka_bootstrap", "kafka_sasl"]

# The ``baton`` commands the tests run never read the user's own contexts (a test that
# needs contexts points BATON_CONTEXTS at a file of its own), nor a broker or context
# named in the user's environment.
os.environ["BATON_CONTEXTS"] = os.path.join(tempfile.mkdtemp(prefix="baton-test-"), "none.json")
for _name in ("BATON_BROKER", "BATON_CONTEXT"):
    os.environ.pop(_name, None)
