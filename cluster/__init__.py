"""Everything replicated: events and codec, the ordered log, the pure state machine,
and the node driver that connects them to a store (docs/design.md §2-§9)."""

__all__: list[str] = []
