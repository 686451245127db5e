"""Membership, views, leadership, fencing and ownership hand-over in the pure core.

A small harness plays the brokers' duties deterministically: after each step every
runtime the state knows does what :func:`batonmq.cluster.membership.duties` tells it
(propose when the state names it proposer, vote when listed), as the node driver does.
"""

from __future__ import annotations

from batonmq.cluster.errors import Fenced, InvalidArgument, NotOwner
from batonmq.cluster.events import (
    Acquire,
    DeclareQueue,
    Enqueue,
    Event,
    Heartbeat,
    Interest,
    Leave,
    Origin,
    Propose,
    Vote,
)
from batonmq.cluster.membership import Ballot, duties
from batonmq.cluster.results import Counted
from batonmq.cluster.effects import Acquired, Completed, Effect, MembersChanged, OwnerChanged
from batonmq.cluster.state import State


class Cluster:
    def __init__(self) -> None:
        self.state = State(suspect_beats=6)
        self.seqs: dict[str, int] = {}
        self.offset = -1
        self.effects: list[Effect] = []
        # What each runtime proposed and voted on whose event is not applied yet (the
        # node driver remembers it while the append is in flight; here every append is
        # applied at once, so it is forgotten right after, as the driver does then).
        self.proposed: dict[str, Ballot] = {}
        self.voted: dict[str, Ballot] = {}
        self.silent: set[str] = set()  # runtimes that do not act now (paused, slow)

    def apply(self, who: str, ev: Event) -> Completed:
        self.seqs[who] = seq = self.seqs.get(who, 0) + 1
        node, runtime = who.split("/")
        self.offset += 1
        out: list[Effect] = []
        self.state.apply(self.offset, Origin(node, runtime, seq, 1000 + self.offset), ev, out)
        self.effects.extend(out)
        done = [e for e in out if isinstance(e, Completed)]
        return done[0]

    def beat(self, *who: str, role: str = "voter") -> None:
        for w in who:
            self.apply(w, Heartbeat(role, f"addr-{w}", {"zone": w[0]}))
        self.duties()

    def duties(self) -> None:
        """Every runtime proposes and votes as the policy says, until none has more to do."""
        ms = self.state.membership
        for _ in range(10):
            acted = False
            for who in list(ms.beat_order):
                if who not in ms.known or who in self.silent:
                    continue
                d = duties(ms, who, ms.known[who].role, self.proposed.get(who), self.voted.get(who))
                if d.propose is not None:
                    self.proposed[who] = d.propose
                    self.apply(who, Propose(d.propose[0], d.propose[1], "cid"))
                    del self.proposed[who]
                    acted = True
                if d.vote is not None:
                    self.voted[who] = d.vote
                    self.apply(who, Vote(d.vote[0], True))
                    del self.voted[who]
                    acted = True
            if not acted:
                return


def test_bootstrap_new_members_at_the_end_and_stable_leader() -> None:
    c = Cluster()
    c.beat("a/1")
    ms = c.state.membership
    assert ms.members == ["a/1"] and ms.view_seq == 1 and ms.cluster_id == "cid"
    c.beat("b/1")
    c.beat("c/1")
    assert ms.members == ["a/1", "b/1", "c/1"] and ms.leader() == "a/1"
    # c dies: a and b keep beating; after 6 of their beats c is suspected and dropped.
    for _ in range(6):
        c.beat("a/1", "b/1")
    assert ms.members == ["a/1", "b/1"]
    assert ms.leader() == "a/1"  # killing a non-leader does not move the leader
    # a dies: b is leader.
    for _ in range(6):
        c.beat("b/1")
    assert ms.members == ["b/1"] and ms.leader() == "b/1"
    changes = [e for e in c.effects if isinstance(e, MembersChanged) and not e.properties]
    assert [e.view_seq for e in changes] == [1, 2, 3, 4, 5]


def test_a_runtime_that_comes_while_a_proposal_waits_gets_the_next_view() -> None:
    """While a proposal waits for a slow voter the proposer proposes nothing (the state
    would ignore it); the next view, with the newcomer, follows once it is in."""
    c = Cluster()
    for who in ("a/1", "b/1", "c/1"):
        c.beat(who)
    ms = c.state.membership
    c.silent = {"d/1"}  # d beats but is slow to vote
    c.beat("d/1")
    assert ms.proposal is not None and ms.voters_pending() == ["d/1"]
    c.beat("e/1")  # wants in while the proposal waits for d
    c.beat("a/1", "b/1", "c/1", "e/1")
    assert ms.members == ["a/1", "b/1", "c/1"]
    c.silent = set()
    c.duties()
    assert ms.members == ["a/1", "b/1", "c/1", "d/1", "e/1"]
    assert c.state.ignored.get("bad-proposal", 0) == 0


def test_a_proposal_lost_or_left_waiting_on_a_suspected_voter_is_made_again() -> None:
    """The proposer forgets a proposal once its event is applied or its append failed:
    a Propose lost with a failed append is made again, and so is a view it proposed
    before, once the proposal that stood in its way waits for a suspected voter."""
    c = Cluster()
    for who in ("a/1", "b/1", "c/1"):
        c.beat(who)
    ms = c.state.membership
    c.silent = {"a/1"}
    c.beat("d/1")  # a would propose: pretend its append fails
    d = duties(ms, "a/1", "voter", None, None)
    assert d.propose == (ms.view_seq + 1, ("a/1", "b/1", "c/1", "d/1"))
    again = duties(ms, "a/1", "voter", None, None)  # the failed append is forgotten
    assert again.propose == d.propose
    c.silent = {"d/1"}
    c.duties()  # opened; a, b, c vote; d is slow
    assert ms.voters_pending() == ["d/1"]
    c.beat("e/1")  # e wants in: nothing to do while d may still vote
    assert ms.voters_pending() == ["d/1"]
    for _ in range(6):  # d goes quiet for good: suspected, the proposal must not wait
        c.beat("a/1", "b/1", "c/1", "e/1")
    assert ms.members == ["a/1", "b/1", "c/1", "e/1"] and ms.proposal is None
    assert c.state.ignored.get("bad-proposal", 0) == 0


def test_suspicion_is_counted_in_log_order_not_by_clocks() -> None:
    c = Cluster()
    c.beat("a/1")
    c.beat("b/1")
    for _ in range(5):
        c.beat("a/1")
    assert not c.state.membership.suspected("b/1")  # 5 of a's beats: not yet
    c.beat("b/1")  # b speaks again: its silence starts over
    for _ in range(5):
        c.beat("a/1")
    assert c.state.membership.members == ["a/1", "b/1"]


def test_observer_never_votes_never_leads_and_gets_laxer_timeouts() -> None:
    c = Cluster()
    c.beat("o/1", role="observer")
    ms = c.state.membership
    assert ms.members == [] and ms.proposer() is None  # an observer alone cannot form a view
    c.beat("a/1")
    assert ms.members == ["a/1", "o/1"] or ms.members == ["o/1", "a/1"]
    assert ms.leader() == "a/1"
    for _ in range(12):
        c.beat("a/1")
    assert "o/1" in ms.members  # 12 beats: an observer is not suspected before 18
    for _ in range(6):
        c.beat("a/1")
    assert ms.members == ["a/1"]
    # A vote from an observer is not counted.
    assert ms.vote("o/1", ms.view_seq + 1, True) is None


def test_view_change_releases_holdings_passes_ownership_and_fences() -> None:
    c = Cluster()
    c.beat("a/1")
    c.beat("b/1")
    assert c.apply("a/1", DeclareQueue("q")).error is None
    c.apply("a/1", Enqueue("q", tuple((b"%d" % i, {}) for i in range(10))))
    c.apply("b/1", Interest("q", True))  # b first: b owns
    c.apply("a/1", Interest("q", True))
    q = c.state.queues["q"]
    assert q.owner == "b/1"
    assert isinstance(c.apply("a/1", Acquire("q", "a/1/1", 3)).error, NotOwner)
    assert c.apply("b/1", Acquire("q", "b/1/1", 4)).result == Counted(4)
    # b is paused (SIGSTOP): a keeps beating; the view drops b at one log position.
    for _ in range(6):
        c.beat("a/1")
    assert c.state.membership.members == ["a/1"]
    assert q.owner == "a/1" and not q.acquired and q.ready == 10
    assert all(q.counts[p] == 1 for p in range(4))  # raised: they were delivered
    assert OwnerChanged("q", "a/1") in c.effects
    # b resumes: its late acquire is fenced and changes nothing.
    late = c.apply("b/1", Acquire("q", "b/1/1", 4))
    assert isinstance(late.error, Fenced) and q.ready == 10
    assert c.state.ignored["fenced"] == 1
    # ... and it rejoins as a new member at the end, no longer owner.
    c.beat("b/1")
    assert c.state.membership.members == ["a/1", "b/1"]
    got = c.apply("a/1", Acquire("q", "a/1/1", 2))
    acquired = [e for e in c.effects if isinstance(e, Acquired)][-1]
    assert got.result == Counted(2) and acquired.positions == [0, 1]


def test_clean_leave_is_dropped_without_waiting() -> None:
    c = Cluster()
    c.beat("a/1")
    c.beat("b/1")
    c.apply("b/1", Leave())
    c.duties()
    assert c.state.membership.members == ["a/1"]


def test_second_process_with_the_same_node_id_is_refused() -> None:
    c = Cluster()
    c.beat("a/1")
    c.beat("a/2")  # same node id, new runtime, while a/1 lives
    c.beat("a/1")
    ms = c.state.membership
    assert "a/2" in ms.refused and "in use" in ms.refused["a/2"]
    assert ms.members == ["a/1"]


def test_restart_after_a_crash_replaces_the_old_runtime() -> None:
    c = Cluster()
    c.beat("a/1")
    c.beat("a/2")  # a/1 was killed; its successor beats
    assert c.state.membership.members == ["a/1"]  # not yet: a/1 may be alive
    for _ in range(6):
        c.beat("a/2")
    assert c.state.membership.members == ["a/2"]


def test_proposals_from_non_proposers_and_stale_views_are_ignored() -> None:
    c = Cluster()
    c.beat("a/1")
    c.beat("b/1")
    bad = c.apply("b/1", Propose(3, ("b/1",), "x"))
    assert isinstance(bad.error, InvalidArgument)
    bad = c.apply("b/1", Propose(c.state.membership.view_seq + 1, ("b/1",), "x"))
    assert isinstance(bad.error, InvalidArgument)  # b is not the proposer
    assert c.state.ignored["bad-proposal"] == 2
