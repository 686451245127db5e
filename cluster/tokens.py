"""Fencing tokens on a data partition of a split log (docs/design.md §16).

Pure. Service terms are granted on the control partition, which a data partition cannot
read in its own log order; so a data partition keeps, per service, the highest fencing
token it has seen (from :class:`~batonmq.cluster.events.FenceTerm`, which every broker
appends when it applies a new term, or from a range commit itself), and refuses a range
commit with a lower one.
"""

from __future__ import annotations

from collections.abc import Callable

from batonmq.cluster.errors import InvalidArgument, StaleToken

__all__ = ["fence_term", "check_token"]


def fence_term(tokens: dict[str, int], service: str, token: int) -> None:
    """Apply ``FenceTerm(service, token)``: a lower token is stale here from now on.

    Raises:
        InvalidArgument: no service, or a negative token.
    """
    if not service or token < 0:
        raise InvalidArgument("FenceTerm needs a service and a token >= 0")
    if token > tokens.get(service, -1):
        tokens[service] = token


def check_token(
    tokens: dict[str, int], service: str, token: int, ignore: Callable[[str], None]
) -> None:
    """A range commit of ``service``'s term ``token`` on a data partition: current
    unless a higher token of the service was seen here (then it is the highest).

    Raises:
        InvalidArgument: a negative token.
        StaleToken: a later term has acted on this partition (counted ``stale-token``).
    """
    if token < 0:
        raise InvalidArgument(f"a fencing token for service {service!r} must be >= 0")
    high = tokens.get(service, -1)
    if token < high:
        ignore("stale-token")
        raise StaleToken(
            f"fencing token {token} of service {service!r} is stale: a later term ({high})"
            " has acted on this partition"
        )
    tokens[service] = token
