"""Whether a replica works right now: one flag its appender and applier share."""

from __future__ import annotations

__all__ = ["Health"]


class Health:
    """False from a failed append, log read or store write until the next batch is
    applied and stored (the broker reports it; commands wait meanwhile)."""

    __slots__ = ("ok", "problem", "log_cut")

    def __init__(self) -> None:
        self.ok = True
        #: What is wrong when it needs an operator (a corrupt log); "" otherwise.
        self.problem = ""
        #: (log end, applied offset) once the log was found to end below the offset
        #: applied here (records cut from its end): for good, until a restart, since
        #: what is appended lands at offsets already applied.
        self.log_cut: tuple[int, int] | None = None

    def cut(self, end: int, applied: int, problem: str) -> None:
        """The log ends at ``end``, at or below ``applied``: unhealthy for good."""
        self.log_cut = (end, applied)
        self.ok = False
        self.problem = problem

    def recovered(self) -> None:
        """A batch was applied and stored: healthy again, unless the log was cut."""
        if self.log_cut is None:
            self.ok = True
            self.problem = ""
