"""The client-suite runner's own logic, without a download or a broker: the
expected-failures file, a JUnit XML file compared with it, and the shipped list."""

from __future__ import annotations

from pathlib import Path

import pytest

from batonmq.loadtest.amqp_suites import (
    EXPECTED_FILE, ExpectedFileError, compare, format_verdict, load_expected, main, parse_junit,
)
from batonmq.loadtest.amqp_suites_plugin import test_id as plugin_test_id

EXPECTED = """
[[cause]]
key = "x-expires"
reason = "x-expires not supported (406)"
fix = "replicated: a queue-expiry event behind a feature flag"
tests = [
    "pika:tests.acceptance.async_adapter_tests.TestExpires::test_it",
    "pika:tests.acceptance.async_adapter_tests.TestGone::test_fixed_by_now",
]

[[cause]]
key = "per-broker consumers"
reason = "consumers are known per broker"
modes = ["3"]
tests = ["pika:tests.acceptance.blocking_adapter_test.TestExclusive::test_other_broker"]

[[cause]]
key = "internet"
reason = "needs the internet"
skip = true
tests = ["pika:tests.acceptance.blocking_adapter_test.TestDns::test_resolve"]
"""

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="1" tests="6" time="12.5">
<testcase classname="tests.acceptance.async_adapter_tests.TestExpires" name="test_it" time="1">
  <failure message="ChannelClosedByBroker: (406, 'PRECONDITION_FAILED')">trace</failure>
</testcase>
<testcase classname="tests.acceptance.async_adapter_tests.TestGone" name="test_fixed_by_now" time="1"/>
<testcase classname="tests.acceptance.async_adapter_tests.TestNew" name="test_broken[x]" time="1">
  <failure message="AssertionError: 1 != 2&#10;more">trace</failure>
</testcase>
<testcase classname="tests.acceptance.async_adapter_tests.TestNew" name="test_broken[x]" time="0">
  <error message="teardown failed">trace</error>
</testcase>
<testcase classname="tests.acceptance.blocking_adapter_test.TestDns" name="test_resolve" time="0">
  <skipped message="needs the internet" type="pytest.skip"/>
</testcase>
<testcase classname="tests.acceptance.blocking_adapter_test.TestExclusive" name="test_other_broker" time="1"/>
</testsuite></testsuites>
"""


def test_the_expected_file_parses_into_causes_per_mode() -> None:
    expected = load_expected(EXPECTED)
    assert [c.key for c in expected.causes] == ["x-expires", "per-broker consumers", "internet"]
    one = expected.for_mode("1")
    assert set(one) == {
        "pika:tests.acceptance.async_adapter_tests.TestExpires::test_it",
        "pika:tests.acceptance.async_adapter_tests.TestGone::test_fixed_by_now",
        "pika:tests.acceptance.blocking_adapter_test.TestDns::test_resolve",
    }
    assert "pika:tests.acceptance.blocking_adapter_test.TestExclusive::test_other_broker" in (
        expected.for_mode("3"))
    assert one["pika:tests.acceptance.blocking_adapter_test.TestDns::test_resolve"].skip


@pytest.mark.parametrize("text, words", [
    ("[[cause]\n", "not TOML"),
    ('[[cause]]\nkey = "a"\nreason = "r"\n', "no 'tests'"),
    ('[[cause]]\nkey = "a"\nreason = "r"\ntests = "pika:a::b"\n', "list of test ids"),
    ('[[cause]]\nkey = "a"\nreason = "r"\ntests = ["a::b"]\n', "SUITE:classname::name"),
    ('[[cause]]\nkey = "a"\nreason = "r"\ntests = ["kombu:a::b"]\n', "SUITE:classname::name"),
    ('[[cause]]\nkey = "a"\nreason = "r"\ntests = ["pika:a::b"]\n'
     '[[cause]]\nkey = "b"\nreason = "r"\nmodes = ["3"]\ntests = ["pika:a::b"]\n', "under 'a' too"),
])
def test_a_malformed_expected_file_says_where(text: str, words: str) -> None:
    with pytest.raises(ExpectedFileError, match=words):
        load_expected(text)


def test_one_test_may_have_a_cause_per_mode() -> None:
    expected = load_expected(
        '[[cause]]\nkey = "a"\nreason = "r"\nmodes = ["1"]\ntests = ["pika:a::b"]\n'
        '[[cause]]\nkey = "b"\nreason = "r"\nmodes = ["3"]\ntests = ["pika:a::b"]\n')
    assert expected.for_mode("1")["pika:a::b"].key == "a"
    assert expected.for_mode("3")["pika:a::b"].key == "b"
    assert "pika:a::b" not in expected.for_mode("rabbitmq")


def test_junit_statuses_keep_the_worst_report_of_a_test() -> None:
    outcome = parse_junit(JUNIT, "pika")
    assert outcome.counts() == {"passed": 2, "failed": 1, "error": 1, "skipped": 1}
    assert outcome.duration == 12.5
    new = "pika:tests.acceptance.async_adapter_tests.TestNew::test_broken[x]"
    assert outcome.status[new] == "error"  # failed, then its teardown errored
    assert outcome.messages["pika:tests.acceptance.async_adapter_tests.TestExpires::test_it"] == (
        "ChannelClosedByBroker: (406, 'PRECONDITION_FAILED')")


def test_a_new_failure_fails_and_a_listed_test_that_passes_is_named() -> None:
    expected = load_expected(EXPECTED)
    outcome = parse_junit(JUNIT, "pika")
    verdict = compare(outcome, expected, "1", {"pika"})
    assert not verdict.ok
    assert verdict.new_failures == ["pika:tests.acceptance.async_adapter_tests.TestNew::test_broken[x]"]
    assert verdict.now_passing == [
        "pika:tests.acceptance.async_adapter_tests.TestGone::test_fixed_by_now"]
    assert verdict.expected_failures == {
        "x-expires": ["pika:tests.acceptance.async_adapter_tests.TestExpires::test_it"]}
    assert verdict.not_run == []
    text = format_verdict(outcome, verdict, expected, "pika")
    assert "1 NEW failure(s)" in text and "TestNew::test_broken[x]  -- teardown failed" in text
    assert "1 listed test(s) pass now" in text and "FAILED" in text


def test_a_run_with_only_listed_failures_is_ok() -> None:
    expected = load_expected(EXPECTED)
    only_listed = JUNIT.replace("TestNew", "TestExpires").replace("test_broken[x]", "test_it")
    verdict = compare(parse_junit(only_listed, "pika"), expected, "1", {"pika"})
    assert verdict.ok and verdict.new_failures == []


def test_the_cluster_only_cause_does_not_hide_a_failure_on_one_broker() -> None:
    failing = JUNIT.replace(
        'name="test_other_broker" time="1"/>',
        'name="test_other_broker" time="1"><failure message="403"/></testcase>')
    expected = load_expected(EXPECTED)
    other = "pika:tests.acceptance.blocking_adapter_test.TestExclusive::test_other_broker"
    assert other in compare(parse_junit(failing, "pika"), expected, "1", {"pika"}).new_failures
    assert other in compare(parse_junit(failing, "pika"), expected, "3", {"pika"}).expected_failures[
        "per-broker consumers"]


def test_other_suites_listed_tests_are_not_missing_from_a_run() -> None:
    expected = load_expected(
        EXPECTED + '[[cause]]\nkey = "tx"\nreason = "r"\ntests = ["aio-pika:tests.test_amqp.T::t"]\n')
    verdict = compare(parse_junit(JUNIT, "pika"), expected, "1", {"pika"})
    assert verdict.not_run == []


def test_the_plugin_names_a_test_as_junit_does() -> None:
    assert plugin_test_id("tests/test_amqp.py::TestCaseAmqp::test_x[connect]") == (
        "tests.test_amqp.TestCaseAmqp::test_x[connect]")
    assert plugin_test_id("tests/test_rpc.py::test_simple") == "tests.test_rpc::test_simple"


def test_the_shipped_list_parses() -> None:
    expected = load_expected(EXPECTED_FILE.read_text())
    assert all(c.reason for c in expected.causes)
    # Every failure Baton is expected to have says how RabbitMQ fares on those tests.
    assert all(c.rabbitmq for c in expected.causes if not c.skip), [
        c.key for c in expected.causes if not c.skip and not c.rabbitmq]
    parsed = load_expected(EXPECTED + 'rabbitmq = "passes"\n')
    assert parsed.causes[-1].rabbitmq == "passes" and parsed.causes[0].rabbitmq == ""


def test_check_mode_exits_1_on_a_new_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "expected.toml"
    exp.write_text(EXPECTED)
    junit = tmp_path / "pika.junit.xml"
    junit.write_text(JUNIT)
    assert main(["--suite", "pika", "--expected", str(exp), "--check", str(junit)]) == 1
    assert "NEW failure" in capsys.readouterr().out
    junit.write_text(JUNIT.replace("TestNew", "TestExpires").replace("test_broken[x]", "test_it"))
    assert main(["--suite", "pika", "--expected", str(exp), "--check", str(junit)]) == 0
