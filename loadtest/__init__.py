"""Load-test harness: workloads, faults, history checker, reports."""

__all__: list[str] = []
