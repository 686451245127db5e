"""Whether a replica works right now: one flag its appender and applier share."""

from __future__ import annotations

__all__ = ["Health"]


class Health:
    """False from a failed append, log read or store write until the next batch is
    applied and stored (the broker reports it; commands wait meanwhile)."""

    __slots__ = ("ok", "problem")

    def __init__(self) -> None:
        self.ok = True
        #: What is wrong when it needs an operator (a corrupt log); "" otherwise.
        self.problem = ""
