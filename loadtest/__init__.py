"""Load-test harness (issue 6): workloads, faults, history checker, reports."""

__all__: list[str] = []
