"""``baton serve``'s settings by three routes: a TOML file, ``BATON_*`` environment
variables and flags. A flag wins over the environment, which wins over the file, which
wins over the default.

Every option is a field of :class:`~batonmq.broker.config.BrokerConfig`; its name, type,
default and metadata (help, choices, least value) give the flag ``--<name>`` (dashes for
underscores, or the field's ``flag``), the variable ``BATON_<NAME>`` and the file key
``<name>``. Nothing here lists the options again, so the routes cannot drift apart
(docs/configuration.md is the reference, and a test checks every field by each route).

Value forms: in the file, TOML values of the field's type (a boolean for a switch, an integer for a whole
number, a number for seconds, a string, an array of strings for a list, a table of
strings for a map). In the environment, text: ``a,b`` for a list, ``k=v,k2=v2`` for a map, ``true``/``false`` for a switch.
Flags are text too (a switch's flag takes no value: it sets it true); a list or map
flag is repeated once per item. A route that sets a
list or a map replaces it whole.
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
import types
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, get_type_hints

from batonmq.broker.config import BrokerConfig, parse_address
from batonmq.cluster.errors import InvalidArgument

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "Option",
    "add_flags",
    "config_path",
    "flag_values",
    "load",
    "options",
    "to_toml",
]

ENV_PREFIX = "BATON_"
#: The file a ``--config`` flag or this variable names (the flag wins).
CONFIG_ENV = ENV_PREFIX + "CONFIG"
_DEST = "opt_"  # argparse dest prefix of the option flags (clear of the global flags)


@dataclass(frozen=True, slots=True)
class Option:
    """One ``BrokerConfig`` field as an operator sets it.

    Attributes:
        name: the field name, also the config file key.
        kind: "bool", "int", "float", "str", "optional", "list" or "map".
        default: the default value (MISSING: required).
        flags: the flag and its aliases.
        env: the environment variable.
        help: what it means.
        choices: the allowed values, if only some are.
        secret: not shown by ``--print-config``.
    """

    name: str
    kind: str
    default: Any
    flags: tuple[str, ...]
    env: str
    help: str
    choices: tuple[str, ...] | None
    secret: bool

    def describe_default(self) -> str:
        """The default as the reference shows it."""
        if self.default is MISSING:
            return "(required)"
        if self.default is None:
            return "(not set)"
        return _toml_value(self.default)


def _kind(hint: Any) -> str:
    if hint is bool:
        return "bool"
    if hint is int:
        return "int"
    if hint is float:
        return "float"
    if hint is str:
        return "str"
    if isinstance(hint, types.UnionType) and set(hint.__args__) == {str, type(None)}:
        return "optional"
    origin = getattr(hint, "__origin__", None)
    if origin is list:
        return "list"
    if origin is dict:
        return "map"
    raise TypeError(f"BrokerConfig field type {hint!r} has no option form: add one here")


def options(cls: type[Any] = BrokerConfig) -> list[Option]:
    """The options of a settings dataclass (default: ``BrokerConfig``), in field order."""
    hints = get_type_hints(cls)
    out = []
    for f in fields(cls):
        meta = f.metadata
        default: Any = f.default
        if f.default_factory is not MISSING:
            default = f.default_factory()
        flag = meta.get("flag", "--" + f.name.replace("_", "-"))
        out.append(
            Option(
                name=f.name,
                kind=_kind(hints[f.name]),
                default=default,
                flags=(flag, *meta.get("aliases", ())),
                env=ENV_PREFIX + f.name.upper(),
                help=meta.get("help", ""),
                choices=meta.get("choices"),
                secret=bool(meta.get("secret", False)),
            )
        )
    return out


# --- flags ----------------------------------------------------------------------------


def add_flags(parser: argparse.ArgumentParser, cls: type[Any] = BrokerConfig) -> None:
    """Add one flag per option to ``parser``, plus ``--listen HOST:PORT`` (``--host``
    and ``--port`` at once). Flags default to "not given" so the other routes show."""
    for opt in options(cls):
        metavar = {"list": "NAME", "map": "KEY=VALUE"}.get(opt.kind, opt.name.upper())
        if opt.choices:
            metavar = "{" + ",".join(opt.choices) + "}"
        repeat = " (repeatable)" if opt.kind in ("list", "map") else ""
        text = f"{opt.help}{repeat}; env {opt.env}; default {opt.describe_default()}"
        if opt.kind == "bool":  # a switch: the flag sets it (false is the default)
            parser.add_argument(
                *opt.flags, dest=_DEST + opt.name, default=None, action="store_const",
                const="true", help=text,
            )
            continue
        parser.add_argument(
            *opt.flags,
            dest=_DEST + opt.name,
            default=None,
            metavar=metavar,
            action="append" if opt.kind in ("list", "map") else "store",
            help=text,
        )


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The options given as flags (by name, as text or lists of text), ``--listen``
    split into host and port unless ``--host`` / ``--port`` are given too.

    Raises:
        InvalidArgument: ``--listen`` is not a valid address.
    """
    given = {
        key[len(_DEST):]: value
        for key, value in vars(args).items()
        if key.startswith(_DEST) and value is not None
    }
    listen = getattr(args, "listen", None)
    if listen is not None:
        try:
            host, port = parse_address(listen)
        except InvalidArgument as exc:
            raise InvalidArgument(f"--listen: {exc.message}") from None
        given.setdefault("host", host)
        given.setdefault("port", str(port))
    return given


# --- converting one value -------------------------------------------------------------


def _from_text(opt: Option, text: str | list[str]) -> Any:
    """A flag's or a variable's text as the option's type.

    Raises:
        ValueError: the text does not fit (the message says what it must be).
    """
    items: list[str]
    if isinstance(text, list):
        items = text  # a repeated flag: one item each
    else:
        items = [part.strip() for part in text.split(",") if part.strip()]
    match opt.kind:
        case "bool":
            assert isinstance(text, str)
            word = text.strip().lower()
            if word in ("true", "1", "yes", "on"):
                return True
            if word in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"must be true or false, got {text!r}")
        case "int":
            assert isinstance(text, str)
            try:
                return int(text.replace("_", ""))
            except ValueError:
                raise ValueError(f"must be a whole number, got {text!r}") from None
        case "float":
            assert isinstance(text, str)
            try:
                return float(text)
            except ValueError:
                raise ValueError(f"must be a number, got {text!r}") from None
        case "str" | "optional":
            assert isinstance(text, str)
            return text
        case "list":
            return items
        case _:
            out = {}
            for item in items:
                key, sep, value = item.partition("=")
                if not sep or not key.strip():
                    raise ValueError(f"needs KEY=VALUE items, got {item!r}")
                out[key.strip()] = value.strip()
            return out


def _from_toml(opt: Option, value: Any) -> Any:
    """A config file value as the option's type (no conversion between TOML types but
    an integer where a number is wanted).

    Raises:
        ValueError: the value has the wrong type.
    """
    shown = json.dumps(value, default=str)
    match opt.kind:
        case "bool":
            if isinstance(value, bool):
                return value
            raise ValueError(f"must be true or false, got {shown}")
        case "int":
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise ValueError(f"must be a whole number, got {shown}")
        case "float":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            raise ValueError(f"must be a number, got {shown}")
        case "str" | "optional":
            if isinstance(value, str):
                return value
            raise ValueError(f"must be a string, got {shown}")
        case "list":
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return list(value)
            raise ValueError(f"must be an array of strings, got {shown}")
        case _:
            if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
                return dict(value)
            raise ValueError(f"must be a table of strings (KEY = \"VALUE\"), got {shown}")


# --- merging --------------------------------------------------------------------------


def _read_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise InvalidArgument(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"config file {path} is not valid TOML: {exc}") from None


def load(
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    path: str | None = None,
) -> tuple[BrokerConfig, dict[str, str]]:
    """The effective configuration: defaults, then the file, then the environment,
    then the flags.

    Args:
        flags: option name -> text (or list of texts) given as flags (:func:`flag_values`).
        env: the environment (only ``BATON_<OPTION>`` variables are read).
        path: the TOML config file, if any.

    Returns:
        The configuration, validated, and where each value not left at its default
        came from (option name -> "file PATH", "env VAR" or "flag --FLAG").

    Raises:
        InvalidArgument: one line naming the key and where it was set: an unknown key
            in the file, a value of the wrong type, a bad value, a missing file, not TOML.
    """
    by_name = {opt.name: opt for opt in options()}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if path is not None:
        for key, raw in _read_file(path).items():
            opt = by_name.get(key)
            if opt is None:
                raise InvalidArgument(
                    f"config file {path}: unknown key {key!r} (the keys are in docs/configuration.md)"
                )
            try:
                values[key] = _from_toml(opt, raw)
            except ValueError as exc:
                raise InvalidArgument(f"config file {path}: key {key!r} {exc}") from None
            sources[key] = f"file {path}"
    for opt in by_name.values():
        text = env.get(opt.env)
        if text is None:
            continue
        try:
            values[opt.name] = _from_text(opt, text)
        except ValueError as exc:
            raise InvalidArgument(f"environment variable {opt.env} {exc}") from None
        sources[opt.name] = f"env {opt.env}"
    for name, text in flags.items():
        opt = by_name[name]
        try:
            values[name] = _from_text(opt, text)
        except ValueError as exc:
            raise InvalidArgument(f"flag {opt.flags[0]} {exc}") from None
        sources[name] = f"flag {opt.flags[0]}"
    if "data_dir" not in values:
        raise InvalidArgument(
            "data_dir is not set: give --data-dir, BATON_DATA_DIR or data_dir in a --config file"
        )
    config = BrokerConfig(**values)
    found = config.problem()
    if found is not None:
        key, what = found
        where = sources.get(key, "default")
        # A rule between two options names the other one's value and origin too.
        others = "".join(
            f"; {name} = {_shown(getattr(config, name))} ({sources.get(name, 'default')})"
            for name in by_name
            if name != key and re.search(rf"\b{name}\b", what)
        )
        raise InvalidArgument(
            f"{key} = {_shown(getattr(config, key))} ({where}): {what}{others}"
        )
    return config, sources


# --- printing -------------------------------------------------------------------------


def _shown(value: Any) -> str:
    """A value in an error message: its TOML form, or "(not set)"."""
    return "(not set)" if value is None else _toml_value(value)


def _toml_value(value: Any) -> str:
    # JSON's string escapes are TOML's basic-string escapes (ensure_ascii=False keeps
    # other characters as UTF-8, which TOML allows, instead of surrogate pairs).
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"no TOML form for {value!r}")


def to_toml(config: Any, sources: Mapping[str, str] | None = None) -> str:
    """The configuration (a ``BrokerConfig``, or another settings dataclass) as a TOML
    file that :func:`load` reads back to the same configuration; each value not at its default says where it came from. A secret
    option is left out (a comment says so); an option not set is a comment too."""
    sources = sources or {}
    lines = ["# baton serve: the effective configuration (docs/configuration.md)"]
    for opt in options(type(config)):
        value = getattr(config, opt.name)
        note = f"  # {sources[opt.name]}" if opt.name in sources else ""
        if opt.secret and value:
            lines.append(f"# {opt.name} is set (secret, not shown){note}")
        elif value is None:
            lines.append(f"# {opt.name} is not set")
        else:
            lines.append(f"{opt.name} = {_toml_value(value)}{note}")
    return "\n".join(lines) + "\n"


def config_path(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """The config file named by ``--config``, else by ``BATON_CONFIG``, else None."""
    given = getattr(args, "config", None)
    if given is not None:
        return str(given)
    return env.get(CONFIG_ENV) or None
