"""Fixtures shared by every test tier."""

from __future__ import annotations

from tests.kafka_fixture import kafka_session_dir, kafka_bootstrap, kafka_sasl

__all__ = ["kafka_session_dir", "kafka_bootstrap", "kafka_sasl"]
