"""Membership, views and leadership, in log order (docs/design.md §7). Pure: no I/O, no clock.

Members are broker *runtimes*, keyed ``"node/runtime"``: a restarted broker is a new
member, and events from a runtime that the established view does not contain are
fenced (ignored, deterministically, on every replica).

Suspicion without clocks: for every runtime ``m`` the state counts, per other
runtime ``r``, how many heartbeats ``r`` appended since ``m``'s last one. ``m`` is
suspected once some other runtime has beaten ``suspect_beats`` times meanwhile
(observers get ``observer_factor`` times that). With the default 500 ms beat and 6
beats that is ~3 s, measured by the others' beats as the log orders them — so a
paused or partitioned broker is suspected the same way on every replica.

Views: the *proposer* (the first live voter of the established view, or the first
heartbeating voter when there is none) appends ``Propose(seq + 1, members)`` when
the desired member list differs from the view: live members in their order, then
new runtimes in the order of their first heartbeat (new members at the end). Every
voter listed answers ``Vote``; when all have voted yes the view is established. The
leader is the first voter of the established view: stable while it lives.
:func:`duties` is that policy for one runtime: what it should propose and vote on,
given the membership as applied (the node driver appends what it returns).

Join keys: a runtime that joins live puts the public key of its member proof on the log
with its ``Join`` (cluster/member_proof.py); :attr:`Membership.join_keys` remembers it,
so that a member asked for the update can check the joiner's proof. A key is forgotten
when its runtime leaves or is dropped from the view; of the runtimes outside the view
(joiners not admitted yet, or that died before they were) only the latest
:data:`MAX_PENDING_JOINS` are kept, so the map stays bounded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Member", "Membership", "VOTER", "OBSERVER", "Ballot", "Duties", "duties",
    "JOIN_KEY_BYTES", "MAX_PENDING_JOINS",
]

VOTER = "voter"
OBSERVER = "observer"
#: The size of a join key: a raw Ed25519 public key.
JOIN_KEY_BYTES = 32
#: Join keys kept for runtimes outside the established view (the oldest go first).
MAX_PENDING_JOINS = 64

#: A view as proposed or voted on: (view_seq, members in order).
Ballot = tuple[int, tuple[str, ...]]


@dataclass(slots=True)
class Member:
    """What the log says about one broker runtime."""

    key: str  # "node/runtime"
    node: str
    runtime: str
    role: str
    address: str
    properties: dict[str, Any]
    hold: int = -1  # lowest log offset it still needs (Heartbeat.hold)

    def snapshot(self) -> list[Any]:
        return [self.key, self.node, self.runtime, self.role, self.address,
                sorted(self.properties.items()), self.hold]

    @classmethod
    def restore(cls, s: list[Any]) -> "Member":
        return cls(s[0], s[1], s[2], s[3], s[4], {k: v for k, v in s[5]},
                   s[6] if len(s) > 6 else -1)


@dataclass(slots=True)
class Proposal:
    seq: int
    members: list[str]
    proposer: str
    votes: set[str] = field(default_factory=set)


class Membership:
    """The replicated membership state; driven by :class:`batonmq.cluster.state.State`."""

    def __init__(self, suspect_beats: int = 6, observer_factor: int = 3) -> None:
        self.suspect_beats = suspect_beats
        self.observer_factor = observer_factor
        self.cluster_id = ""
        self.view_seq = 0
        self.members: list[str] = []  # the established view, in its stable order
        self.member_set: set[str] = set()  # the same, for the per-event fencing check
        self.known: dict[str, Member] = {}  # every runtime that ever beat (until dropped)
        self.beat_order: list[str] = []  # runtimes by their first heartbeat
        self.silence: dict[str, dict[str, int]] = {}
        self.left: set[str] = set()
        self.refused: dict[str, str] = {}  # key -> why (duplicate node id)
        self.proposal: Proposal | None = None
        # Runtime -> the public key its Join carried, in log order (module docstring).
        self.join_keys: dict[str, bytes] = {}

    # -- queries (all deterministic) -------------------------------------------------

    def is_member(self, key: str) -> bool:
        return key in self.member_set

    def silent_beats(self, key: str) -> int:
        """How many heartbeats another member appended since ``key``'s last one (the
        most of any): about 1 for a member that beats, growing for a silent one."""
        quiet = self.silence.get(key)
        return max(quiet.values()) if quiet else 0

    def suspected(self, key: str) -> bool:
        if key in self.left:
            return True
        quiet = self.silence.get(key)
        if not quiet:
            return False
        limit = self.suspect_beats
        m = self.known.get(key)
        if m is not None and m.role == OBSERVER:
            limit *= self.observer_factor
        return max(quiet.values()) >= limit

    def _voter(self, key: str) -> bool:
        m = self.known.get(key)
        return m is not None and m.role == VOTER

    def desired(self) -> list[str]:
        """The member list the next view should have."""
        live = [k for k in self.members if not self.suspected(k)]
        present = set(live)
        nodes = {self.known[k].node for k in live if k in self.known}
        new = []
        for k in self.beat_order:
            if k in present or k in self.refused or self.suspected(k):
                continue
            node = self.known[k].node
            if node in nodes:
                continue  # an older runtime of this node is still live
            new.append(k)
            nodes.add(node)
        return live + new

    def proposer(self) -> str | None:
        """Who should propose the next view (None: nobody can)."""
        for k in self.members:
            if self._voter(k) and not self.suspected(k):
                return k
        for k in self.beat_order:
            if self._voter(k) and not self.suspected(k) and k not in self.refused:
                return k
        return None

    def leader(self) -> str | None:
        """The first voter of the established view."""
        for k in self.members:
            if self._voter(k):
                return k
        return None

    def live_leader(self) -> str | None:
        """The leader while it is alive; None when it is suspected (a view change that
        drops it is due) or there is none. What the topology shows."""
        lead = self.leader()
        return None if lead is None or self.suspected(lead) else lead

    def voter_alive(self) -> bool:
        """Is some voter alive (a member or a new runtime that beats)? If not, no view
        can change: observers never propose (docs/design.md §7)."""
        return self.proposer() is not None

    def hold(self) -> int | None:
        """The lowest offset any live runtime still needs on the log (None: some
        live runtime has not told yet): the log may be truncated below it."""
        holds = [m.hold for k, m in self.known.items() if not self.suspected(k)]
        if not holds or min(holds) < 0:
            return None
        return min(holds)

    def needs_view(self) -> bool:
        return self.desired() != self.members

    def voters_pending(self) -> list[str]:
        """Voters listed in the open proposal that have not voted yet."""
        p = self.proposal
        if p is None:
            return []
        return [k for k in p.members if self._voter(k) and k not in p.votes]

    # -- transitions ------------------------------------------------------------------

    def heartbeat(self, key: str, node: str, runtime: str, role: str, address: str,
                  properties: dict[str, Any], hold: int = -1) -> bool:
        """Record a heartbeat. Returns True if the member's properties changed."""
        m = self.known.get(key)
        changed = m is not None and (m.properties != properties or m.address != address)
        if m is None:
            self.known[key] = Member(key, node, runtime, role, address, dict(properties), hold)
            self.beat_order.append(key)
        else:
            m.address, m.properties, m.hold = address, dict(properties), hold
        for other, quiet in self.silence.items():
            if other != key:
                quiet[key] = quiet.get(key, 0) + 1
        self.silence[key] = {}
        self.left.discard(key)
        self._check_duplicates(key, node)
        return changed

    def _check_duplicates(self, key: str, node: str) -> None:
        """The older runtime of a node beat after a newer one appeared: the newer
        one is a second process with the same node id, and is refused."""
        for newer in self.beat_order:
            nm = self.known.get(newer)
            if nm is None or newer == key or nm.node != node or newer in self.refused:
                continue
            if key in self.members and newer not in self.members:
                self.refused[newer] = (
                    f"node id {node!r} is in use by a running broker (runtime "
                    f"{self.known[key].runtime})"
                )

    def leave(self, key: str) -> None:
        self.left.add(key)
        self.join_keys.pop(key, None)  # it stops: it asks for no update any more

    def join(self, key: str, public: bytes) -> None:
        """Record the join key runtime ``key``'s Join carried (the last one counts).
        Keeps at most :data:`MAX_PENDING_JOINS` of runtimes outside the view, dropping
        the oldest."""
        self.join_keys.pop(key, None)
        self.join_keys[key] = public
        pending = [k for k in self.join_keys if k not in self.member_set]
        for old in pending[: max(0, len(pending) - MAX_PENDING_JOINS)]:
            del self.join_keys[old]

    def propose(self, key: str, seq: int, members: list[str], cluster_id: str) -> str | None:
        """Apply a proposal; returns why it is ignored, or None if it is open now."""
        if seq != self.view_seq + 1:
            return "stale view proposal"
        if key != self.proposer():
            return "not the proposer"
        if not members or any(m not in self.known for m in members):
            return "proposal names unknown members"
        open_ = self.proposal
        if open_ is not None and open_.seq == seq:
            # First in log order wins, unless it waits for a voter now suspected.
            if not any(self.suspected(v) for v in self.voters_pending()):
                return "a proposal for this view is open"
        self.proposal = Proposal(seq, list(members), key)
        if not self.cluster_id:
            self.cluster_id = cluster_id
        return None

    def vote(self, key: str, seq: int, yes: bool) -> tuple[list[str], list[str]] | None:
        """Apply a vote. Returns (new members, removed) when the view is established."""
        p = self.proposal
        if p is None or p.seq != seq or key not in p.members or not self._voter(key):
            return None
        if not yes:
            self.proposal = None
            return None
        p.votes.add(key)
        if self.voters_pending():
            return None
        removed = [k for k in self.members if k not in p.members]
        self.members = list(p.members)
        self.member_set = set(self.members)
        self.view_seq = p.seq
        self.proposal = None
        for k in removed:
            self._forget(k)
        return list(self.members), removed

    def _forget(self, key: str) -> None:
        """A runtime left the view for good; a later heartbeat makes it new again."""
        self.known.pop(key, None)
        self.silence.pop(key, None)
        self.left.discard(key)
        self.refused.pop(key, None)
        self.join_keys.pop(key, None)
        if key in self.beat_order:
            self.beat_order.remove(key)
        for quiet in self.silence.values():
            quiet.pop(key, None)

    # -- persistence ------------------------------------------------------------------

    def snapshot(self) -> list[Any]:
        p = self.proposal
        return [
            self.cluster_id,
            self.view_seq,
            list(self.members),
            [self.known[k].snapshot() for k in sorted(self.known)],
            list(self.beat_order),
            sorted((k, sorted(v.items())) for k, v in self.silence.items()),
            sorted(self.left),
            sorted(self.refused.items()),
            None if p is None else [p.seq, list(p.members), p.proposer, sorted(p.votes)],
            [[k, v] for k, v in self.join_keys.items()],  # in log order: it decides pruning
        ]

    def restore(self, s: list[Any]) -> None:
        self.cluster_id, self.view_seq = s[0], s[1]
        self.members = list(s[2])
        self.member_set = set(self.members)
        self.known = {m[0]: Member.restore(m) for m in s[3]}
        self.beat_order = list(s[4])
        self.silence = {k: {r: n for r, n in v} for k, v in s[5]}
        self.left = set(s[6])
        self.refused = {k: v for k, v in s[7]}
        p = s[8]
        self.proposal = None if p is None else Proposal(p[0], list(p[1]), p[2], set(p[3]))
        # Snapshots written before join keys existed have no such entry.
        self.join_keys = {k: v for k, v in s[9]} if len(s) > 9 else {}


@dataclass(frozen=True, slots=True)
class Duties:
    """What one runtime should append after an applied batch (None: nothing)."""

    propose: Ballot | None = None  # Propose this view (the cluster id is the caller's)
    vote: Ballot | None = None  # Vote yes on this open proposal


def duties(
    ms: Membership, me: str, role: str, proposed: Ballot | None, voted: Ballot | None
) -> Duties:
    """The propose-vote policy of runtime ``me``, given the membership as applied.

    Args:
        ms: the membership state.
        me: the runtime's member key.
        role: its role (VOTER or OBSERVER): only a voter proposes.
        proposed: the view it proposed whose Propose is not applied yet, if any (it
            does not propose it again meanwhile). The caller forgets it once that
            Propose is applied or its append failed: a proposal that was ignored, lost
            or replaced since must be made again when it can open.
        voted: the proposal it voted on whose Vote is not applied yet, if any (it does
            not vote twice meanwhile; forgotten the same way: a proposal replaced by an
            equal one after the vote counted waits for the vote again).

    Returns:
        The view to propose, if ``me`` is the proposer, the view should change and a
        proposal can open now (none is open, or the open one waits for a suspected
        voter: the state ignores any other); and the open proposal to vote yes on, if
        ``me`` is one of the voters it waits for.
    """
    propose: Ballot | None = None
    if role == VOTER and ms.proposer() == me and ms.needs_view():
        wanted = (ms.view_seq + 1, tuple(ms.desired()))
        if wanted != proposed and (
            ms.proposal is None or any(ms.suspected(v) for v in ms.voters_pending())
        ):
            propose = wanted
    vote: Ballot | None = None
    p = ms.proposal
    if p is not None and me in ms.voters_pending():
        ballot = (p.seq, tuple(p.members))
        if ballot != voted:
            vote = ballot
    return Duties(propose, vote)
