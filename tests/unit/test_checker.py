"""The load-test history checker catches each broken guarantee (docs/design.md §5, §12)."""

from __future__ import annotations

from pathlib import Path

from batonmq.loadtest.checker import LOST_CLASSES, VIOLATIONS, check
from batonmq.loadtest.hist import LogHistogram
from batonmq.loadtest.history import Op, OpKind, load_run, make_body, parse_body, write_ops

K = OpKind


class History:
    """Builds a hand-made history with increasing timestamps."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.t = 0

    def add(self, kind: OpKind, actor: str, queue: str = "q", msg: str = "",
            position: int = -1, count: int = -1, info: str = "") -> History:
        self.t += 1000
        self.ops.append(Op(kind, self.t, actor, queue, msg, position, count, info))
        return self

    def publish(self, msg: str, position: int, queue: str = "q") -> History:
        self.add(K.PUBLISH_INVOKE, "p1", queue, msg)
        return self.add(K.PUBLISH_OK, "p1", queue, msg, position)

    def deliver(self, consumer: str, msg: str, position: int, count: int = 0,
                queue: str = "q") -> History:
        return self.add(K.DELIVER, consumer, queue, msg, position, count)

    def ack(self, consumer: str, msg: str, position: int, queue: str = "q") -> History:
        self.add(K.ACK_INVOKE, consumer, queue, msg, position)
        return self.add(K.ACK_OK, consumer, queue, msg, position)

    def final(self, left: int = 0, queue: str = "q") -> History:
        return self.add(K.FINAL, "runner", queue, count=left)


def clean() -> History:
    """Two consumers, a release and redelivery, a consumer lost with a hold, a drain."""
    h = History().add(K.QUEUE, "runner", info="delivery_limit=3,dead_letter=")
    for i in range(6):
        h.publish(f"p1:{i}", i)
    h.deliver("c1", "p1:0", 0).deliver("c2", "p1:1", 1).deliver("c1", "p1:2", 2)
    h.ack("c1", "p1:0", 0).ack("c2", "p1:1", 1)
    h.add(K.RELEASE, "c1", "q", "p1:2", 2, 0)
    h.deliver("c2", "p1:2", 2, count=1).ack("c2", "p1:2", 2)
    h.deliver("c1", "p1:3", 3)
    h.add(K.CONSUMER_LOST, "c1", "q")  # its broker died: p1:3 goes back
    h.deliver("c2", "p1:3", 3, count=1).ack("c2", "p1:3", 3)
    h.deliver("c2", "p1:4", 4)
    h.add(K.ACK_INVOKE, "c2", "q", "p1:4", 4).add(K.ACK_FAIL, "c2", "q", "p1:4", 4)
    h.deliver("drain", "p1:5", 5).ack("drain", "p1:5", 5)
    return h.final(0)


def test_clean_history_passes() -> None:
    result = check(clean().ops)
    assert result.ok, result.summary()
    assert all(result.counts[k] == 0 for k in VIOLATIONS)
    assert result.counts["pending"] == 0
    assert result.stats["confirmed"] == 6
    assert result.stats["redeliveries"] == 2


def test_lost_confirmed_message_is_caught() -> None:
    h = History().publish("p1:0", 0).publish("p1:1", 1)
    h.deliver("c1", "p1:0", 0).ack("c1", "p1:0", 0).final(0)
    result = check(h.ops)
    assert not result.ok
    assert result.counts["lost"] == 1
    assert "p1:1" in result.examples["lost"][0]


def test_pending_messages_are_not_counted_lost() -> None:
    h = History().publish("p1:0", 0).publish("p1:1", 1).final(1)
    result = check(h.ops)
    assert result.counts["pending"] == 1
    assert result.counts["lost"] == 1  # two unaccepted, at most one of them still queued


def test_concurrent_double_delivery_is_caught() -> None:
    h = History().publish("p1:0", 0)
    h.deliver("c1", "p1:0", 0).deliver("c2", "p1:0", 0, count=0)
    h.ack("c2", "p1:0", 0).final(0)
    result = check(h.ops)
    assert not result.ok
    assert result.counts["double_delivery"] == 1
    assert "held by c1" in result.examples["double_delivery"][0]


def test_redelivery_after_a_lost_consumer_is_not_a_double_delivery() -> None:
    h = History().publish("p1:0", 0)
    h.deliver("c1", "p1:0", 0).add(K.CONSUMER_LOST, "c1", "q")
    h.deliver("c2", "p1:0", 0, count=1).ack("c2", "p1:0", 0).final(0)
    assert check(h.ops).ok


def test_accepted_then_redelivered_is_caught() -> None:
    h = History().publish("p1:0", 0)
    h.deliver("c1", "p1:0", 0).ack("c1", "p1:0", 0)
    h.deliver("c2", "p1:0", 0, count=1).ack("c2", "p1:0", 0).final(0)
    result = check(h.ops)
    assert not result.ok
    assert result.counts["redelivered_after_accept"] == 1
    assert result.counts["double_delivery"] == 0


def test_duplicate_enqueue_is_caught() -> None:
    h = History().publish("p1:0", 0)
    h.deliver("c1", "p1:0", 0).ack("c1", "p1:0", 0)
    h.deliver("c1", "p1:0", 7).ack("c1", "p1:0", 7).final(0)  # same id, second position
    result = check(h.ops)
    assert not result.ok
    assert result.counts["duplicate_enqueue"] == 1


def test_order_violation_is_caught() -> None:
    h = History()
    for i in range(3):
        h.publish(f"p1:{i}", i)
    h.deliver("c1", "p1:0", 0).deliver("c1", "p1:2", 2).deliver("c1", "p1:1", 1)
    for i in range(3):
        h.ack("c1", f"p1:{i}", i)
    result = check(h.final(0).ops)
    assert not result.ok
    assert result.counts["order"] == 1


def test_unread_messages_returned_by_an_ended_consumer_are_not_out_of_order() -> None:
    h = History()
    for i in range(3):
        h.publish(f"p1:{i}", i)
    h.deliver("c1", "p1:2", 2).ack("c1", "p1:2", 2)
    # c2 took 0 and 1 from the broker but never read them; its end returns them.
    h.add(K.CONSUMER_END, "c2", "q")
    h.deliver("c1", "p1:0", 0).deliver("c1", "p1:1", 1)
    h.ack("c1", "p1:0", 0).ack("c1", "p1:1", 1)
    assert check(h.final(0).ops).ok


def test_poison_loop_past_the_delivery_limit_is_caught() -> None:
    h = History().add(K.QUEUE, "runner", info="delivery_limit=2,dead_letter=q.dlq")
    h.publish("p1:0", 0)
    for count in range(3):
        h.deliver("c1", "p1:0", 0, count=count).add(K.RELEASE, "c1", "q", "p1:0", 0, count)
    h.deliver("c1", "p1:0", 0, queue="q.dlq").ack("c1", "p1:0", 0, queue="q.dlq")
    result = check(h.final(0).ops)
    assert not result.ok
    assert result.counts["poison_loop"] == 1


def test_dead_lettered_message_must_reach_its_dead_letter_queue() -> None:
    h = History().add(K.QUEUE, "runner", info="delivery_limit=2,dead_letter=q.dlq")
    h.publish("p1:0", 0)
    for count in range(2):
        h.deliver("c1", "p1:0", 0, count=count).add(K.RELEASE, "c1", "q", "p1:0", 0, count)
    assert check(h.final(0).ops).counts["lost"] == 1  # never showed up in q.dlq
    h.deliver("c1", "p1:0", 0, queue="q.dlq").ack("c1", "p1:0", 0, queue="q.dlq")
    assert check(h.ops).ok


def test_rejected_message_without_a_dead_letter_queue_is_dropped_not_lost() -> None:
    h = History().add(K.QUEUE, "runner", info="delivery_limit=5,dead_letter=")
    h.publish("p1:0", 0).deliver("c1", "p1:0", 0).add(K.REJECT, "c1", "q", "p1:0", 0, 0)
    result = check(h.final(0).ops)
    assert result.ok, result.summary()
    assert result.stats["dropped"] == 1


def test_history_files_round_trip_and_merge_in_time_order(tmp_path: Path) -> None:
    ops = clean().ops
    write_ops(tmp_path / "a.hist", ops[::2])
    write_ops(tmp_path / "b.hist", ops[1::2])
    loaded = load_run(tmp_path)
    assert [(o.kind, o.t, o.actor, o.msg, o.position, o.count) for o in loaded] == [
        (o.kind, o.t, o.actor, o.msg, o.position, o.count) for o in ops
    ]
    assert check(loaded).ok


def test_body_carries_the_message_id() -> None:
    body = make_body(b"p3:17", ord("r"), 1024)
    assert len(body) == 1024
    assert parse_body(body) == ("p3:17", ord("r"))
    assert parse_body(b"no id here") == ("", 0)


def test_histogram_percentiles_are_close() -> None:
    h = LogHistogram(range(1, 100_001))
    assert h.count == 100_000 and h.max == 100_000
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = q * 100_000
        assert exact <= h.percentile(q) <= exact * 1.02
    assert h.percentile(1.0) == 100_000


def fault(h: History, kind: str, address: str, phase: int = 0) -> History:
    return h.add(K.FAULT, "faults", "", kind, count=phase, info=f"node=node-1 address={address}")


def test_a_killed_brokers_consumers_lose_their_holds_at_the_fault() -> None:
    # c1 is on broker A, c2 on broker B. A is killed: the cluster gives c1's message to
    # c2 before c1's client notices anything (its consumer-lost record comes later).
    def history(fault_address: str | None) -> History:
        h = History().publish("p1:0", 0)
        h.add(K.CONNECTED, "c1", info="127.0.0.1:1").add(K.CONNECTED, "c2", info="127.0.0.1:2")
        h.deliver("c1/q", "p1:0", 0)
        if fault_address is not None:
            fault(h, "kill9", fault_address)
        h.deliver("c2/q", "p1:0", 0, count=1).ack("c2/q", "p1:0", 0)
        h.add(K.CONSUMER_LOST, "c1/q", "q")
        return h.final(0)

    assert check(history("127.0.0.1:1").ops).ok
    wrong_broker = check(history("127.0.0.1:2").ops)
    assert wrong_broker.counts["double_delivery"] == 1  # B's consumer still held nothing
    assert check(history(None).ops).counts["double_delivery"] == 1


def test_a_fault_does_not_excuse_a_double_delivery_before_it() -> None:
    h = History().publish("p1:0", 0)
    h.add(K.CONNECTED, "c1", info="127.0.0.1:1")
    h.deliver("c1/q", "p1:0", 0).deliver("c2/q", "p1:0", 0)  # both hold it: a violation
    fault(h, "sigstop", "127.0.0.1:1")
    h.ack("c2/q", "p1:0", 0).final(0)
    result = check(h.ops)
    assert result.counts["double_delivery"] == 1


def test_a_consumer_that_failed_over_is_not_ended_by_a_fault_of_its_old_broker() -> None:
    h = History().publish("p1:0", 0).publish("p1:1", 1)
    h.add(K.CONNECTED, "c1", info="127.0.0.1:1")
    h.add(K.CONNECTED, "c1", info="127.0.0.1:2")  # failed over to B
    h.deliver("c1/q", "p1:1", 1)
    fault(h, "kill9", "127.0.0.1:1")  # A dies: c1's hold on B stays
    h.deliver("c2/q", "p1:1", 1)
    result = check(h.ops)
    assert result.counts["double_delivery"] == 1


def test_without_positions_holds_and_accepts_are_keyed_by_message_id() -> None:
    # RabbitMQ has no positions: the history carries -1, the message id identifies.
    h = History().publish("p1:0", -1).publish("p1:1", -1)
    h.deliver("c1", "p1:0", -1).deliver("c2", "p1:1", -1)  # two messages, no conflict
    h.ack("c1", "p1:0", -1).ack("c2", "p1:1", -1).final(0)
    assert check(h.ops).ok, check(h.ops).summary()

    twice = History().publish("p1:0", -1)
    twice.deliver("c1", "p1:0", -1).deliver("c2", "p1:0", -1)
    assert check(twice.ops).counts["double_delivery"] == 1

    again = History().publish("p1:0", -1)
    again.deliver("c1", "p1:0", -1).ack("c1", "p1:0", -1).deliver("c2", "p1:0", -1, count=1)
    assert check(again.ops).counts["redelivered_after_accept"] == 1


def test_an_ack_fail_ends_the_hold_and_counts_as_a_possible_accept() -> None:
    h = History().publish("p1:0", 0)
    h.deliver("c1", "p1:0", 0)
    h.add(K.ACK_INVOKE, "c1", "q", "p1:0", 0).add(K.ACK_FAIL, "c1", "q", "p1:0", 0)
    h.deliver("c2", "p1:0", 0, count=1)  # the broker never applied it: fine to redeliver
    result = check(h.final(1).ops)
    assert result.ok, result.summary()
    assert result.counts["double_delivery"] == 0


def test_a_message_accepted_twice_is_caught() -> None:
    # A paused broker's consumer accepts a message that the cluster meanwhile gave to
    # another consumer (which accepted it too): one message, two accepts.
    h = History().publish("p1:0", 0)
    h.add(K.CONNECTED, "c1", info="127.0.0.1:1")
    h.deliver("c1/q", "p1:0", 0)
    fault(h, "sigstop", "127.0.0.1:1")
    h.deliver("c2/q", "p1:0", 0, count=1).ack("c2/q", "p1:0", 0)
    h.add(K.ACK_INVOKE, "c1/q", "q", "p1:0", 0).add(K.ACK_OK, "c1/q", "q", "p1:0", 0)
    result = check(h.final(0).ops)
    assert not result.ok
    assert result.counts["accepted_twice"] == 1
    assert result.counts["double_delivery"] == 0 and result.counts["redelivered_after_accept"] == 0


# --- lost by place, unexpected deliveries, split brain ------------------------------------


def lost_in(delivered: list[int], total: int = 6) -> dict[str, int]:
    """A queue of ``total`` confirmed publishes of which only ``delivered`` were
    delivered (and accepted): the lost classes the checker gives the rest."""
    h = History()
    for i in range(total):
        h.publish(f"p1:{i}", i)
    for i in delivered:
        h.deliver("c1", f"p1:{i}", i).ack("c1", f"p1:{i}", i)
    result = check(h.final(0).ops)
    assert result.counts["lost"] == total - len(delivered)
    assert sum(result.counts[k] for k in LOST_CLASSES) == result.counts["lost"]
    return {k: result.counts[k] for k in LOST_CLASSES}


def test_messages_lost_before_the_first_delivered_one_are_a_lost_prefix() -> None:
    assert lost_in([2, 3, 4, 5]) == {"lost_prefix": 2, "lost_middle": 0, "lost_postfix": 0}


def test_messages_lost_between_delivered_ones_are_a_lost_middle() -> None:
    assert lost_in([0, 1, 4, 5]) == {"lost_prefix": 0, "lost_middle": 2, "lost_postfix": 0}


def test_messages_lost_after_the_last_delivered_one_are_a_lost_postfix() -> None:
    assert lost_in([0, 1, 2, 3]) == {"lost_prefix": 0, "lost_middle": 0, "lost_postfix": 2}


def test_lost_classes_are_per_queue_and_named_in_the_examples() -> None:
    h = History()
    for i in range(3):
        h.publish(f"a:{i}", i, queue="qa").publish(f"b:{i}", i, queue="qb")
    # qa lost its head, qb its tail: by position within each queue, not across queues.
    for i in (1, 2):
        h.deliver("c1", f"a:{i}", i, queue="qa").ack("c1", f"a:{i}", i, queue="qa")
    h.deliver("c1", "b:0", 0, queue="qb").ack("c1", "b:0", 0, queue="qb")
    result = check(h.final(0, queue="qa").ops)
    assert (result.counts["lost_prefix"], result.counts["lost_postfix"]) == (1, 2)
    assert any("a:0" in ex and "lost-prefix" in ex for ex in result.examples["lost"])
    assert "lost by place" in result.summary()


def test_a_delivered_but_never_accepted_message_is_classed_against_the_others() -> None:
    h = History()
    for i in range(3):
        h.publish(f"p1:{i}", i)
    h.deliver("c1", "p1:0", 0).add(K.CONSUMER_END, "c1", "q")  # delivered, never accepted
    h.deliver("c2", "p1:1", 1).ack("c2", "p1:1", 1).deliver("c2", "p1:2", 2).ack("c2", "p1:2", 2)
    result = check(h.final(0).ops)
    assert result.counts["lost"] == 1 and result.counts["lost_prefix"] == 1


def test_a_clean_history_has_no_lost_class_unexpected_or_split_brain() -> None:
    result = check(clean().ops)
    assert all(result.counts[k] == 0 for k in (*LOST_CLASSES, "unexpected", "split_brain"))
    assert result.ok


def test_a_delivery_of_a_message_nobody_published_is_unexpected() -> None:
    h = History().publish("p1:0", 0)
    h.deliver("c1", "p1:0", 0).ack("c1", "p1:0", 0)
    h.deliver("c1", "p9:7", 1).ack("c1", "p9:7", 1)  # no producer ever sent p9:7
    h.deliver("c1", "", 2).ack("c1", "", 2)  # a body without a message id
    result = check(h.final(0).ops)
    assert not result.ok
    assert result.counts["unexpected"] == 2
    assert "p9:7 was never published" in result.examples["unexpected"][0]
    assert "no message id" in result.examples["unexpected"][1]


def test_a_published_but_unconfirmed_message_is_not_unexpected() -> None:
    # A publish whose confirm was lost (publish-fail) may still have been enqueued:
    # delivering it is fine, the id was attempted.
    h = History().add(K.PUBLISH_INVOKE, "p1", "q", "p1:0").add(K.PUBLISH_FAIL, "p1", "q", "p1:0")
    h.deliver("c1", "p1:0", 0).ack("c1", "p1:0", 0)
    result = check(h.final(0).ops)
    assert result.counts["unexpected"] == 0 and result.ok, result.summary()


def two_brokers() -> History:
    """Worker w1 is connected to broker A, w2 to broker B."""
    h = History()
    return h.add(K.CONNECTED, "w1", info="A:1").add(K.CONNECTED, "w2", info="B:2")


def test_one_message_held_through_two_brokers_at_once_is_a_split_brain() -> None:
    h = two_brokers().publish("p1:0", 0)
    h.deliver("w1/q", "p1:0", 0).deliver("w2/q", "p1:0", 0)  # both brokers acted as owner
    h.ack("w2/q", "p1:0", 0).final(0)
    result = check(h.ops)
    assert not result.ok
    assert (result.counts["split_brain"], result.counts["double_delivery"]) == (1, 1)
    assert "through B:2" in result.examples["split_brain"][0]
    assert "through A:1" in result.examples["split_brain"][0]
    assert result.brokers["B:2"]["split_brain"] == 1
    assert result.brokers["A:1"]["split_brain"] == 0


def test_one_message_accepted_through_two_brokers_is_a_split_brain() -> None:
    h = two_brokers().publish("p1:0", 0)
    h.deliver("w1/q", "p1:0", 0).ack("w1/q", "p1:0", 0)
    h.add(K.ACK_INVOKE, "w2/q", "q", "p1:0", 0).add(K.ACK_OK, "w2/q", "q", "p1:0", 0)
    result = check(h.final(0).ops)
    assert result.counts["split_brain"] == 1 and result.counts["accepted_twice"] == 1


def test_a_double_delivery_on_one_broker_is_not_a_split_brain() -> None:
    h = History().add(K.CONNECTED, "w1", info="A:1").publish("p1:0", 0)
    h.deliver("w1/q", "p1:0", 0).deliver("w1/r", "p1:0", 0)
    result = check(h.final(0).ops)
    assert (result.counts["split_brain"], result.counts["double_delivery"]) == (0, 1)


def test_handing_a_queue_between_brokers_is_compared_per_broker_and_not_a_split_brain() -> None:
    # Consumers on two brokers share a queue: ownership moves between them, and a
    # message released on A is delivered again through B. Each broker's share shows.
    h = two_brokers()
    for i in range(4):
        h.publish(f"p1:{i}", i)
    h.deliver("w1/q", "p1:0", 0).ack("w1/q", "p1:0", 0)
    h.deliver("w1/q", "p1:1", 1).add(K.RELEASE, "w1/q", "q", "p1:1", 1, 0)
    h.deliver("w2/q", "p1:1", 1, count=1).ack("w2/q", "p1:1", 1)
    h.deliver("w2/q", "p1:2", 2).ack("w2/q", "p1:2", 2)
    h.deliver("w1/q", "p1:3", 3)
    fault(h, "kill9", "A:1")  # A dies holding p1:3; B redelivers it
    h.deliver("w2/q", "p1:3", 3, count=1).ack("w2/q", "p1:3", 3)
    result = check(h.final(0).ops)
    assert result.ok, result.summary()
    assert result.counts["split_brain"] == 0
    assert result.brokers == {
        "A:1": {"deliveries": 3, "messages": 3, "accepted": 1, "split_brain": 0},
        "B:2": {"deliveries": 3, "messages": 3, "accepted": 3, "split_brain": 0},
    }
    assert result.to_dict()["brokers"]["B:2"]["accepted"] == 3


def test_a_delivery_before_its_delay_or_retry_delay_is_caught() -> None:
    """Work-queue runs: a delayed message must not come before its delay, a failed one
    not before the queue's retry delay; delayed messages are exempt from the order
    check (they come after later positions, by design)."""

    def run(delay_gap: int, retry_gap: int) -> dict[str, int]:
        h = History().add(K.QUEUE, "runner", info="delivery_limit=3,dead_letter=,retry_ms=10")
        h.add(K.PUBLISH_INVOKE, "p1", "q", "p1:0", info="delay_ms=20")
        h.add(K.PUBLISH_OK, "p1", "q", "p1:0", 0)
        h.publish("p1:1", 1)
        h.deliver("c1", "p1:1", 1).ack("c1", "p1:1", 1)
        h.t += delay_gap
        h.deliver("c1", "p1:0", 0)  # first delivery of the delayed one, after position 1
        h.add(K.RELEASE, "c1", "q", "p1:0", 0, 0)
        h.t += retry_gap
        h.deliver("c1", "p1:0", 0, count=1).ack("c1", "p1:0", 0)
        return check(h.final(0).ops).counts

    ok = run(delay_gap=20_000_000, retry_gap=10_000_000)
    assert all(ok[k] == 0 for k in VIOLATIONS), ok
    early = run(delay_gap=0, retry_gap=0)  # (beyond the checker's 5 ms slack)
    assert (early["early_delivery"], early["early_retry"], early["order"]) == (1, 1, 0)


def test_a_delivery_that_arrives_from_a_paused_broker_was_sent_before_the_pause() -> None:
    # The fault record is written just before the broker is stopped: a delivery it sent
    # before that may reach the worker after the record. It starts no hold (the cluster
    # gives that message back after the view change, like the ones held before). After
    # the pause ends, a delivery through that broker starts a hold again: handing out
    # what the cluster gave others meanwhile is a double delivery.
    def history(resume_first: bool) -> History:
        h = History().publish("p1:0", 0)
        h.add(K.CONNECTED, "c1", info="127.0.0.1:1").add(K.CONNECTED, "c2", info="127.0.0.1:2")
        fault(h, "sigstop", "127.0.0.1:1")
        if resume_first:
            fault(h, "sigstop", "127.0.0.1:1", phase=1)
        h.deliver("c1/q", "p1:0", 0)  # in flight at the pause (or, resumed: sent after)
        h.deliver("c2/q", "p1:0", 0, count=1).ack("c2/q", "p1:0", 0)
        if not resume_first:
            fault(h, "sigstop", "127.0.0.1:1", phase=1)
        return h.final(0)

    in_flight = check(history(resume_first=False).ops)
    assert in_flight.ok, in_flight.examples
    assert check(history(resume_first=True).ops).counts["double_delivery"] == 1


def test_a_worker_that_reconnects_during_a_fault_gets_holds_at_once() -> None:
    h = History().publish("p1:0", 0)
    h.add(K.CONNECTED, "c1", info="127.0.0.1:1")
    fault(h, "bitflip", "127.0.0.1:1")
    h.add(K.CONNECTED, "c1", info="127.0.0.1:2")  # failed over: a new connection
    h.deliver("c1/q", "p1:0", 0)
    h.deliver("c2/q", "p1:0", 0)
    assert check(h.final(0).ops).counts["double_delivery"] == 1


def lead(h: History, candidate: str, token: int, end: str = "") -> History:
    h.add(K.LEAD, candidate, "svc", count=token, info=f"n/r/{candidate}")
    return h.add(K.LEAD_END, candidate, "svc", count=token, info=end) if end else h


def test_service_terms_in_turn_pass_and_two_at_once_or_a_smaller_token_are_caught() -> None:
    in_turn = History()
    for i, c in enumerate(["l1.1", "l1.2", "l1.3", "l1.1"]):
        lead(in_turn, c, 10 * (i + 1), end="resigned")
    result = check(in_turn.final(0).ops)
    assert result.ok, result.summary()
    assert result.stats["terms"] == 4

    overlap = lead(lead(History(), "l1.1", 10), "l1.2", 20, end="resigned")
    counts = check(overlap.final(0).ops).counts
    assert (counts["two_leaders"], counts["token_order"]) == (1, 0)

    stale = lead(lead(History(), "l1.1", 20, end="resigned"), "l1.2", 20, end="resigned")
    counts = check(stale.final(0).ops).counts
    assert (counts["two_leaders"], counts["token_order"]) == (0, 1)


def test_a_fault_of_the_leader_s_broker_ends_its_term_and_grants_through_it_start_none() -> None:
    # The leader's broker is stopped for an upgrade: the cluster grants the next term
    # before the old leader's client notices (its lead-end comes later).
    h = History().add(K.CONNECTED, "l1.1", info="127.0.0.1:1")
    h.add(K.CONNECTED, "l1.2", info="127.0.0.1:2").add(K.CONNECTED, "l1.3", info="127.0.0.1:1")
    lead(h, "l1.1", 10)
    fault(h, "upgrade", "127.0.0.1:1")
    lead(h, "l1.3", 15)  # pushed by the stopping broker before it left: no term
    lead(h, "l1.2", 20)
    h.add(K.LEAD_END, "l1.1", "svc", count=10, info="lost")
    h.add(K.LEAD_END, "l1.3", "svc", count=15, info="lost")
    fault(h, "upgrade", "127.0.0.1:1", phase=1)
    result = check(h.final(0).ops)
    assert result.ok, result.summary()
    assert (result.stats["terms_ended_by_faults"], result.stats["terms_from_down_brokers"]) == (1, 1)
    # Without the fault record the same history has two leaders at once.
    unfaulted = [op for op in h.ops if op.kind != K.FAULT]
    assert check(unfaulted).counts["two_leaders"] == 3  # l1.3 over l1.1; l1.2 over both
