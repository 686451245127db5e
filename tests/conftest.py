"""Fixtures shared by every test tier."""

from __future__ import annotations

from tests.kafka_fixture import kafka_bootstrap

__all__ = ["kafka_bootstrap"]
