"""``baton serve``'s configuration (broker/settings.py): every BrokerConfig field by each
route, precedence (flag > environment > file > default), the errors, ``--print-config``
round trips, the example file in docs/, the JSON log lines and the health verdict."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import logging
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from batonmq.broker import logs, settings
from batonmq.broker.cli import main
from batonmq.broker.cli_ops import not_ready
from batonmq.broker.config import BrokerConfig
from batonmq.cluster.errors import InvalidArgument

__all__: list[str] = []

DOCS = Path(__file__).resolve().parents[2] / "docs"
OPTIONS = settings.options()


def _other_value(opt: settings.Option) -> Any:
    """A valid value of ``opt`` that is not its default."""
    if opt.choices:
        return next(c for c in opt.choices if c != opt.default)
    if opt.name.endswith("_listen"):  # an address: HOST:PORT
        return "127.0.0.1:9090"
    if opt.name.endswith("allow_from"):  # networks
        return "10.0.0.0/8,loopback"
    match opt.kind:
        case "bool":
            return not opt.default
        case "int":
            return opt.default + 1
        case "float":
            return opt.default * 2 or 1.0
        case "str":
            return f"x-{opt.name}"
        case "optional":
            return f"x-{opt.name}"
        case "list":
            return ["one", "two"]
        case "map":
            return {"zone": "b", "rack": "7"}
    raise AssertionError(opt.kind)


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _as_flag_args(opt: settings.Option, value: Any) -> list[str]:
    if opt.kind == "bool":
        assert value is True, "a switch's flag only sets it"
        return [opt.flags[0]]
    if isinstance(value, list):
        return [a for v in value for a in (opt.flags[0], v)]
    if isinstance(value, dict):
        return [a for k, v in value.items() for a in (opt.flags[0], f"{k}={v}")]
    return [opt.flags[0], str(value)]


def _flags(*argv: str) -> dict[str, Any]:
    from batonmq.broker.cli import build_parser

    return settings.flag_values(build_parser().parse_args(["serve", *argv]))


def test_every_field_is_an_option() -> None:
    assert [o.name for o in OPTIONS] == [f.name for f in dataclasses.fields(BrokerConfig)]
    assert all(o.help for o in OPTIONS), [o.name for o in OPTIONS if not o.help]
    # The flags the brokers have always been started with are still there.
    flags = {f for o in OPTIONS for f in o.flags}
    assert {"--data-dir", "--log", "--node-id", "--role", "--property", "--service",
            "--max-message", "--heartbeat-ms", "--join"} <= flags


@pytest.mark.parametrize("opt", [o for o in OPTIONS if o.name != "data_dir"], ids=lambda o: o.name)
def test_every_field_is_settable_by_file_env_and_flag(opt: settings.Option, tmp_path: Path) -> None:
    value = _other_value(opt)
    assert value != opt.default
    base = {"data_dir": "d"}
    path = tmp_path / "c.toml"
    path.write_text(f"data_dir = \"d\"\n{opt.name} = {settings._toml_value(value)}\n")
    by_file, src = settings.load({}, {}, str(path))
    assert getattr(by_file, opt.name) == value and src[opt.name] == f"file {path}"
    by_env, src = settings.load({}, {**{"BATON_DATA_DIR": "d"}, opt.env: _as_text(value)})
    assert getattr(by_env, opt.name) == value and src[opt.name] == f"env {opt.env}"
    by_flag, src = settings.load(
        _flags("--data-dir", base["data_dir"], *_as_flag_args(opt, value)), {}
    )
    assert getattr(by_flag, opt.name) == value and src[opt.name] == f"flag {opt.flags[0]}"


def test_data_dir_by_each_route(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('data_dir = "from-file"\n')
    assert settings.load({}, {}, str(path))[0].data_dir == "from-file"
    assert settings.load({}, {"BATON_DATA_DIR": "from-env"})[0].data_dir == "from-env"
    assert settings.load(_flags("--data-dir", "from-flag"), {})[0].data_dir == "from-flag"
    with pytest.raises(InvalidArgument, match="data_dir is not set"):
        settings.load({}, {})


def test_flag_wins_over_env_which_wins_over_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('data_dir = "d"\nmax_prefetch = 11\nheartbeat_ms = 111\nsuspect_beats = 3\n')
    env = {"BATON_MAX_PREFETCH": "22", "BATON_HEARTBEAT_MS": "222"}
    config, src = settings.load(_flags("--max-prefetch", "33"), env, str(path))
    assert (config.max_prefetch, config.heartbeat_ms, config.suspect_beats) == (33, 222, 3)
    assert src == {
        "data_dir": f"file {path}",
        "max_prefetch": "flag --max-prefetch",
        "heartbeat_ms": "env BATON_HEARTBEAT_MS",
        "suspect_beats": f"file {path}",
    }
    assert config.time_slice_ms == BrokerConfig(data_dir="d").time_slice_ms  # the default


def test_a_list_or_map_route_replaces_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('data_dir = "d"\nservices = ["a", "b"]\n[properties]\nzone = "a"\n')
    config, _ = settings.load(_flags("--service", "c"), {"BATON_PROPERTIES": "rack=1"}, str(path))
    assert (config.services, config.properties) == (["c"], {"rack": "1"})


def test_listen_is_host_and_port_and_host_wins_over_it() -> None:
    config, _ = settings.load(
        _flags("--data-dir", "d", "--listen", "0.0.0.0:7000", "--advertise", "db1"), {}
    )
    assert (config.host, config.port, config.advertise) == ("0.0.0.0", 7000, "db1")
    config, _ = settings.load(_flags("--data-dir", "d", "--listen", ":7000", "--host", "::1"), {})
    assert (config.host, config.port) == ("::1", 7000)
    with pytest.raises(InvalidArgument, match="--listen: bad address 'x:y'"):
        _flags("--data-dir", "d", "--listen", "x:y")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('data_dir = "d"\nmax_mesage = 5\n', "unknown key 'max_mesage'"),
        ('data_dir = "d"\n[server]\nport = 1\n', "unknown key 'server'"),
        ('data_dir = "d"\nport = "5671"\n', "key 'port' must be a whole number, got \"5671\""),
        ('data_dir = "d"\nport = true\n', "key 'port' must be a whole number, got true"),
        ('data_dir = "d"\nexpiry_interval = "1s"\n', "key 'expiry_interval' must be a number"),
        ('data_dir = 5\n', "key 'data_dir' must be a string, got 5"),
        ('data_dir = "d"\nservices = "a"\n', "key 'services' must be an array of strings"),
        ('data_dir = "d"\nproperties = { zone = 1 }\n', "key 'properties' must be a table of strings"),
        ('data_dir = "d"\nport = \n', "is not valid TOML"),
    ],
)
def test_file_mistakes_name_the_key_and_the_file(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(InvalidArgument) as caught:
        settings.load({}, {}, str(path))
    assert error in caught.value.message and str(path) in caught.value.message


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('max_prefetch = 0', "max_prefetch = 0 (file {path}): must be at least 1"),
        ('role = "leader"', "role = \"leader\" (file {path}): must be one of 'voter', 'observer'"),
        ('port = 70000', "port = 70000 (file {path}): must be at most 65535"),
        ('node_id = "a/b"', "node_id = \"a/b\" (file {path}): must be printable"),
        ('max_frame = 1000000',
         "max_message = 8388608 (default): must be at most half of max_frame;"
         " max_frame = 1000000 (file {path})"),
    ],
)
def test_bad_values_name_the_key_and_where_it_was_set(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "d"\n{text}\n')
    with pytest.raises(InvalidArgument) as caught:
        settings.load({}, {}, str(path))
    assert error.format(path=path) in caught.value.message


def test_env_and_flag_mistakes_name_the_variable_or_flag() -> None:
    with pytest.raises(InvalidArgument, match="environment variable BATON_MAX_FRAME must be a whole number, got '32M'"):
        settings.load({}, {"BATON_DATA_DIR": "d", "BATON_MAX_FRAME": "32M"})
    with pytest.raises(InvalidArgument, match="flag --property needs KEY=VALUE items, got 'zone'"):
        settings.load(_flags("--data-dir", "d", "--property", "zone"), {})
    with pytest.raises(InvalidArgument, match=r"heartbeat_ms = 5 \(env BATON_HEARTBEAT_MS\)"):
        settings.load({}, {"BATON_DATA_DIR": "d", "BATON_HEARTBEAT_MS": "5"})
    with pytest.raises(InvalidArgument, match="cannot read config file"):
        settings.load({}, {}, "/nonexistent/baton.toml")


def test_other_baton_variables_are_not_options() -> None:
    config, src = settings.load({}, {"BATON_DATA_DIR": "d", "BATON_KAFKA_BOOTSTRAP": "h:1"})
    assert src == {"data_dir": "env BATON_DATA_DIR"}


def test_print_config_round_trips(tmp_path: Path) -> None:
    config, src = settings.load(
        _flags("--data-dir", "d ä \"q\"", "--property", "zone=a b", "--service", "s,1"),
        {"BATON_EXPIRY_INTERVAL": "0.5", "BATON_LOG_URL": "memory:x"},
    )
    text = settings.to_toml(config, src)
    assert "# node_id is not set" in text and "max_message = 8388608\n" in text
    assert "expiry_interval = 0.5  # env BATON_EXPIRY_INTERVAL" in text
    path = tmp_path / "printed.toml"
    path.write_text(text)
    again, _ = settings.load({}, {}, str(path))
    assert again == config


def test_secret_options_are_not_printed() -> None:
    @dataclasses.dataclass
    class WithSecret:
        token: str = dataclasses.field(default="", metadata={"help": "t", "secret": True})

    (opt,) = settings.options(WithSecret)
    assert opt.secret and opt.env == "BATON_TOKEN" and opt.flags == ("--token",)
    text = settings.to_toml(WithSecret(token="s3cret"), {"token": "env BATON_TOKEN"})
    assert "s3cret" not in text and "# token is set (secret, not shown)  # env BATON_TOKEN" in text


def test_the_example_config_file_parses_and_round_trips(tmp_path: Path) -> None:
    example = DOCS / "baton.example.toml"
    config, src = settings.load({}, {}, str(example))
    keys = set(tomllib.loads(example.read_text()))
    assert keys == set(src) and len(keys) >= 10, keys  # it shows most options
    printed = tmp_path / "printed.toml"
    printed.write_text(settings.to_toml(config, src))
    assert settings.load({}, {}, str(printed))[0] == config


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level  # main() sets up logging: put it back
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's exits
            code = int(exc.code or 0)
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)
    return code, out.getvalue(), err.getvalue()


def test_serve_print_config_and_its_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_MAX_PREFETCH", "7")
    code, out, err = _run(["--log-level", "warning", "serve", "--data-dir", "d", "--print-config"])
    assert (code, err) == (0, "")
    printed = tomllib.loads(out)
    assert (printed["max_prefetch"], printed["log_level"], printed["data_dir"]) == (7, "WARNING", "d")
    path = tmp_path / "c.toml"
    path.write_text('data_dir = "d"\nmax_prefetch = "many"\n')
    monkeypatch.delenv("BATON_MAX_PREFETCH")
    monkeypatch.setenv("BATON_CONFIG", str(path))
    code, out, err = _run(["serve", "--print-config"])
    assert code == 2 and out == ""
    assert err == f"baton: config file {path}: key 'max_prefetch' must be a whole number, got \"many\"\n"


def test_json_log_lines() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("baton.test-json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logs.set_identity("node-x", "run-1")
        logger.warning("queue %s is %d deep", "q", 5, extra={"queue": "q", "depth": 5, "obj": object()})
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
        logs.set_identity(None, None)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["time"].endswith("Z") and first["time"][10] == "T"
    assert {k: first[k] for k in ("level", "node", "runtime", "logger", "message", "queue", "depth")} == {
        "level": "WARNING", "node": "node-x", "runtime": "run-1", "logger": "baton.test-json",
        "message": "queue q is 5 deep", "queue": "q", "depth": 5,
    }
    assert first["obj"].startswith("<object")
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc"]


def _topo(**over: Any) -> dict[str, Any]:
    topo: dict[str, Any] = {"member": True, "healthy": True, "join": None, "behind_ms": 400,
                            "suspect_ms": 3000, "view": 2, "applied": 10}
    topo.update(over)
    return topo


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({}, None),
        ({"member": False}, "not a member of the established view"),
        ({"healthy": False}, "unhealthy"),
        ({"join": {"state": "updating", "progress": "3/8 queues"}}, "joining"),
        ({"join": {"queues": 8, "messages": 100, "seconds": 1.0}}, None),
        ({"behind_ms": 4000}, "not caught up: its applied log is 4000 ms behind"),
    ],
)
def test_health_verdict(over: dict[str, Any], why: str | None) -> None:
    got = not_ready(_topo(**over))
    assert got == why if why is None else (got is not None and got.startswith(why)), got


def test_configuration_md_lists_every_option_with_its_routes_and_default() -> None:
    text = (DOCS / "configuration.md").read_text()
    reference = text.split("## Reference", 1)[1]
    rows = {
        cells[0].strip("|` "): cells
        for line in reference.splitlines()
        if line.startswith("| `") and len(cells := line.split(" | ")) >= 6
    }
    wrong = []
    for opt in OPTIONS:
        cells = rows.get(opt.name)
        if cells is None:
            wrong.append(f"{opt.name}: no row")
            continue
        flags = set(re.findall(r"`([^`]+)`", cells[1]))
        default = cells[4].strip("` ")
        if flags != set(opt.flags) or cells[2] != f"`{opt.env}`" or default != opt.describe_default():
            wrong.append(f"{opt.name}: {cells[1:5]} vs {opt.flags}, {opt.env}, {opt.describe_default()}")
    assert not wrong and set(rows) == {o.name for o in OPTIONS}, wrong


class _FakeConnection:
    """What ``baton topology`` / ``baton health`` use of a blocking connection."""

    def __init__(self, topo: dict[str, Any]) -> None:
        self.topo = topo

    def __enter__(self) -> "_FakeConnection":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def topology(self) -> dict[str, Any]:
        return self.topo


@pytest.mark.parametrize(
    ("over", "code", "says"),
    [
        ({}, 0, "is ready: member of view 2"),
        ({"member": False}, 1, "is not ready: not a member of the established view"),
        ({"healthy": False}, 1, "is not ready: unhealthy"),
    ],
)
def test_health_and_topology_exit_codes(
    monkeypatch: pytest.MonkeyPatch, over: dict[str, Any], code: int, says: str
) -> None:
    from batonmq import clients

    topo = _topo(**over, cluster_id="c", changing=False, instances=[], node_id="n1",
                 digest="0" * 16, checkpoint=None)
    monkeypatch.setattr(clients.sync, "connect", lambda address, **kwargs: _FakeConnection(topo))
    got, out, err = _run(["health", "--broker", "127.0.0.1:1"])
    assert (got, err) == (code, "") and out.startswith(f"broker n1 at 127.0.0.1:1 {says}"), out
    got, out, err = _run(["topology", "--broker", "127.0.0.1:1"])
    assert (got, err) == (code, ""), out
    assert ("not a member of the established view" in out) == (topo["member"] is False)
    assert ("UNHEALTHY" in out) == (topo["healthy"] is False)


@pytest.mark.parametrize(
    ("advertise", "got"),
    [("db1", ("db1", 9)), ("db1:7", ("db1", 7)), ("10.0.0.1", ("10.0.0.1", 9)),
     ("[fe80::1]:8", ("fe80::1", 8)), ("fe80::1", ("fe80::1", 9))],
)
def test_advertise_is_a_host_with_or_without_a_port(advertise: str, got: tuple[str, int]) -> None:
    from batonmq.broker.config import split_advertise

    assert split_advertise(advertise, 9) == got
    assert BrokerConfig(data_dir="d", host="0.0.0.0", advertise=advertise).problem() is None


@pytest.mark.parametrize(
    ("host", "advertise", "says"),
    [("0.0.0.0", None, "must be set when listening on all interfaces"),
     ("::", None, "must be set when listening on all interfaces"),
     ("0.0.0.0", "0.0.0.0:5", "not all interfaces"),
     ("127.0.0.1", ":5", "no host"),
     ("127.0.0.1", "db1:x", "port must be a number")],
)
def test_a_broker_on_all_interfaces_must_say_where_it_is_reached(
    host: str, advertise: str | None, says: str
) -> None:
    found = BrokerConfig(data_dir="d", host=host, advertise=advertise).problem()
    assert found is not None and found[0] == "advertise" and says in found[1], found
