"""A small HDR-style latency histogram: log buckets with 64 linear sub-buckets each.

Values are non-negative ints (ns). Each power of two is split into 64 equal sub-buckets, so
a reported percentile is within ~1.6% of the true value; memory is a dict of the buckets
used. Two histograms merge by adding counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["LogHistogram", "exact_percentile"]


def exact_percentile(sorted_values: Sequence[float], q: float) -> float:
    """The value at quantile ``q`` (0..1) of values already sorted (NaN if there are
    none): for the benchmarks, which keep every sample."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]

_SUB_BITS = 6
_SUB = 1 << _SUB_BITS


def _index(value: int) -> int:
    if value < _SUB:
        return value
    shift = value.bit_length() - _SUB_BITS - 1
    # bucket (shift + 1) holds [64 << shift, 128 << shift) in 64 steps of 1 << shift
    return ((shift + 1) << _SUB_BITS) + ((value >> shift) - _SUB)


def _upper(index: int) -> int:
    """The largest value of a bucket (what a percentile reports: never an underestimate)."""
    if index < _SUB:
        return index
    shift = (index >> _SUB_BITS) - 1
    low = ((index & (_SUB - 1)) + _SUB) << shift
    return low + (1 << shift) - 1


class LogHistogram:
    """Counts of values in log-linear buckets, with exact count, min, max and mean."""

    __slots__ = ("_counts", "count", "total", "min", "max")

    def __init__(self, values: Iterable[int] = ()) -> None:
        self._counts: dict[int, int] = {}
        self.count = 0
        self.total = 0
        self.min = 0
        self.max = 0
        for v in values:
            self.record(v)

    def record(self, value: int) -> None:
        """Add one value (negative values count as 0)."""
        v = value if value > 0 else 0
        i = _index(v)
        self._counts[i] = self._counts.get(i, 0) + 1
        if self.count == 0 or v < self.min:
            self.min = v
        if v > self.max:
            self.max = v
        self.count += 1
        self.total += v

    def merge(self, other: LogHistogram) -> None:
        """Add every value of ``other``."""
        for i, c in other._counts.items():
            self._counts[i] = self._counts.get(i, 0) + c
        if other.count:
            self.min = other.min if self.count == 0 else min(self.min, other.min)
            self.max = max(self.max, other.max)
        self.count += other.count
        self.total += other.total

    def percentile(self, q: float) -> int:
        """The value at quantile ``q`` (0..1), as its bucket's upper bound capped by max."""
        if self.count == 0:
            return 0
        rank = max(1, int(q * self.count + 0.5)) if q < 1 else self.count
        seen = 0
        for i in sorted(self._counts):
            seen += self._counts[i]
            if seen >= rank:
                return min(_upper(i), self.max)
        return self.max

    @property
    def mean(self) -> float:
        """The exact mean (0 if empty)."""
        return self.total / self.count if self.count else 0.0

    def summary_ms(self) -> dict[str, float]:
        """p50, p90, p99, p99.9 and max in milliseconds, plus the count."""
        return {
            "count": float(self.count),
            "p50": self.percentile(0.50) / 1e6,
            "p90": self.percentile(0.90) / 1e6,
            "p99": self.percentile(0.99) / 1e6,
            "p99.9": self.percentile(0.999) / 1e6,
            "max": self.max / 1e6,
        }
