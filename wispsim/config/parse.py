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
from wispsim.config.limits import MAX_INT
from wispsim.errors import ConfigError
from wispsim.paths import default_scenario_path


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _number(value: Any, path: str, source: str) -> int | float:
    """A YAML number, or a string that spells one (``1e3``, which YAML 1.1 leaves a string)."""
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        if text.lower() in (".inf", "+.inf", "-.inf", ".nan"):
            text = text.replace(".", "")
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            raise ConfigError(source, path, f"must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(source, path, f"must be a number, got {_show(value)}")
    return value


def _show(value: Any) -> str:
    """A value for a one-line message: its repr, cut short (a huge integer by its digit count)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**15:
        return f"a {len(str(abs(value)))}-digit integer"
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _coerce(value: Any, tp: Any, path: str, source: str, allow_inf: bool = False) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], path, source, allow_inf)
    if origin is Literal:
        allowed = get_args(tp)
        if isinstance(value, bool) and "on" in allowed and "off" in allowed:
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a boolean
        if not isinstance(value, str | int | float | bool) or value not in allowed:
            raise ConfigError(source, path, f"got {_show(value)}; allowed: {', '.join(map(str, allowed))}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(source, path, f"must be a mapping, got {_show(value)}")
        return build(tp, value, source, path)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            value = [value]
        (inner, *_) = get_args(tp)
        return tuple(_coerce(v, inner, f"{path}[{i}]", source) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(source, path, f"must be a mapping, got {_show(value)}")
        _, vt = get_args(tp)
        return {str(k): _coerce(v, vt, f"{path}.{k}", source) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, path, f"must be true or false, got {_show(value)}")
        return value
    if tp is int:
        x = _number(value, path, source)
        if isinstance(x, float) and not (math.isfinite(x) and x == int(x)):
            raise ConfigError(source, path, f"must be an integer, got {_show(value)}")
        x = int(x)
        if not -MAX_INT - 1 <= x <= MAX_INT:
            raise ConfigError(source, path, f"must be a whole number within +-{MAX_INT:.3g}, got {_show(x)}")
        return x
    if tp is float:
        x = _number(value, path, source)
        try:
            f = float(x)
        except OverflowError:
            raise ConfigError(source, path, f"must be a finite number, got {_show(x)}") from None
        if math.isnan(f):
            raise ConfigError(source, path, f"must be a number, got {_show(value)}")
        if math.isinf(f) and not allow_inf:
            raise ConfigError(source, path, f"must be a finite number, got {_show(value)}")
        return f
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(source, path, f"must be a string, got {_show(value)}")
        return value
    raise TypeError(f"unsupported config type {_type_name(tp)} at {path}")  # pragma: no cover


def build(cls: Any, data: Mapping[str, Any], source: str, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, reporting problems with ``source`` and field path."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(source, path, f"unknown field; allowed: {', '.join(sorted(fields))}")
        allow_inf = bool(fields[key].metadata.get("inf"))
        kwargs[key] = _coerce(value, hints[key], path, source, allow_inf)
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


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key given twice in one mapping is an error, not "last wins"."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if dup:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (a key may appear once per mapping)", mark
                )
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(text: str, source: str, field: str = "") -> Any:
    """Parse YAML text strictly (duplicate keys and runaway nesting are errors), one-line errors."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        problem = " ".join(str(problem).split())
        raise ConfigError(source, field, f"malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(source, field, "YAML nested too deeply (more than ~900 levels)") from None


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping from a UTF-8 file; every problem is a one-line :class:`ConfigError`."""
    source = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(source, "", "file not found") from None
    except IsADirectoryError:
        raise ConfigError(source, "", "is a folder, expected a YAML file") from None
    except OSError as e:
        raise ConfigError(source, "", f"cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            source, "", f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); save it as UTF-8"
        ) from None
    data = load_yaml_text(text, source)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, "", f"must be a YAML mapping, got {type(data).__name__}")
    return data


def default_scenario_dict() -> dict[str, Any]:
    return read_yaml(default_scenario_path())


def parse_set(assignments: list[str]) -> dict[str, Any]:
    """Turn ``["server.verifier.delta_ms=3", "workload.duration_s=60"]`` into a nested mapping."""
    out: dict[str, Any] = {}
    for item in assignments:
        if "=" not in item:
            raise ConfigError("--set", item, "expected KEY=VALUE, e.g. server.verifier.delta_ms=3")
        key, raw = item.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        if not all(parts):
            raise ConfigError("--set", key, "expected a dotted field name like server.verifier.delta_ms")
        try:
            value = load_yaml_text(raw, "--set", key)
        except ConfigError as e:
            if "nested too deeply" in e.problem:
                raise
            value = raw  # not YAML: the plain text (a name, a path)
        node = out
        for i, p in enumerate(parts[:-1]):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                done = ".".join(parts[: i + 1])
                raise ConfigError("--set", key, f"{done} was already set to a value, not a section")
        if isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict):
            raise ConfigError(
                "--set", key, f"{key} already has fields set with --set; set it whole or by field"
            )
        node[parts[-1]] = value
    return out
