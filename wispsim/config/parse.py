"""YAML -> frozen dataclasses: reading files, coercing values, merging overrides.

:func:`build` turns a mapping into a config dataclass field by field: unknown keys, wrong types
and bad values are reported with the source (file or ``--set``) and the dotted field path.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from wispsim.config.dist import FieldError
from wispsim.errors import ConfigError
from wispsim.paths import default_scenario_path


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, path: str, source: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], path, source)
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(source, path, f"got {value!r}; allowed: {', '.join(map(str, allowed))}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(source, path, f"must be a mapping, got {type(value).__name__}")
        return build(tp, value, source, path)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            value = [value]
        (inner, *_) = get_args(tp)
        return tuple(_coerce(v, inner, f"{path}[{i}]", source) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(source, path, f"must be a mapping, got {type(value).__name__}")
        _, vt = get_args(tp)
        return {str(k): _coerce(v, vt, f"{path}.{k}", source) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, path, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise ConfigError(source, path, f"must be an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, str) and value.strip().lower() in (".inf", "inf"):
            return math.inf
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ConfigError(source, path, f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(source, path, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {_type_name(tp)} at {path}")  # pragma: no cover


def build(cls: Any, data: Mapping[str, Any], source: str, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, reporting problems with ``source`` and field path."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(source, path, f"unknown field; allowed: {', '.join(sorted(names))}")
        kwargs[key] = _coerce(value, hints[key], path, source)
    try:
        return cls(**kwargs)
    except FieldError as e:
        path = f"{prefix}.{e.field}" if prefix else e.field
        raise ConfigError(source, path, e.problem) from None


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        # a distribution given with its kind replaces the default whole (else a constant would
        # inherit the default's clipping range); link shares are replaced whole too
        replace = k == "links" or (isinstance(v, Mapping) and "dist" in v)
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) and not replace:
            out[k] = deep_merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def read_yaml(path: Path) -> dict[str, Any]:
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(source, "", "file not found") from None
    except OSError as e:
        raise ConfigError(source, "", f"cannot read: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(source, "", f"malformed YAML at {where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, "", f"must be a YAML mapping, got {type(data).__name__}")
    return data


def default_scenario_dict() -> dict[str, Any]:
    return read_yaml(default_scenario_path())


def parse_set(assignments: list[str]) -> dict[str, Any]:
    """Turn ``["server.delta_ms=3", "workload.duration_s=60"]`` into a nested mapping."""
    out: dict[str, Any] = {}
    for item in assignments:
        if "=" not in item:
            raise ConfigError("--set", item, "expected KEY=VALUE, e.g. server.delta_ms=3")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out
