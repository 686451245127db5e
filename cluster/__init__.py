"""Everything replicated: events and codec, the ordered log, the pure state machine,
and the node driver that connects them to a store (DESIGN §2-§6)."""

__all__: list[str] = []
