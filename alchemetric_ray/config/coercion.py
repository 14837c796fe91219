"""From raw values to typed sections: ``section.key=value`` overrides written into a raw mapping, an
unknown or retired key refused with the closest known one, and every value coerced to its field's type
(a choice checked against its Literal, a device name parsed by ``DeviceName``).

What it builds is any dataclass of fields; ``RunConfig.from_dict`` builds itself with it, then validates.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal

from alchemetric_ray.config.vocabulary import DeviceName
from alchemetric_ray.errors import ConfigError


def apply_overrides(raw: dict[str, Any], overrides: typing.Sequence[str]) -> None:
    """Apply ``section.key=value`` strings; values are parsed as YAML scalars/lists."""
    import yaml

    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        dotted, text = item.split("=", 1)
        parts = dotted.strip().split(".")
        if len(parts) != 2:
            raise ConfigError(f"override {item!r}: expected section.key=value (e.g. train.lr=0.001)")
        section, key = parts
        if section not in raw:
            raise ConfigError(_unknown_key(section, list(raw), "", "override"))
        if key not in raw[section]:
            raise ConfigError(_unknown_key(dotted, list(raw[section]), f"{section}.", "override"))
        try:
            raw[section][key] = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            raw[section][key] = text


# Keys a saved model's config may still hold: read and dropped there, refused in one line as input.
RETIRED_KEYS = {
    "signals.n_boot": "the rank-IC intervals are t intervals with a Newey-West standard error, no bootstrap",
}


def _unknown_key(dotted: str, known: list[str], prefix: str, origin: str) -> str:
    if dotted in RETIRED_KEYS:
        return f"{origin + ': ' if origin else ''}config key '{dotted}' was retired: {RETIRED_KEYS[dotted]}"
    name = dotted[len(prefix):]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known: {', '.join(sorted(known))}"
    where = f"{origin}: " if origin else ""
    return f"{where}unknown config key '{dotted}'{hint}"


# --------------------------------------------------------------------------------------------
# Typed construction
# --------------------------------------------------------------------------------------------


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"config '{prefix.rstrip('.') or 'root'}': expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names and f"{prefix}{key}" not in RETIRED_KEYS:
            raise ConfigError(_unknown_key(f"{prefix}{key}", names, prefix, ""))
    kwargs = {}
    for name in names:
        if name not in raw:
            continue
        kwargs[name] = _coerce(hints[name], raw[name], f"{prefix}{name}")
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(typing.cast(type, tp), value, f"{key}.")
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    handler = _BY_ORIGIN.get(origin) if origin is not None else None
    if handler is None:
        handler = next((h for target, h in _BY_TYPE if tp is target), None)
    return handler(tp, value, key) if handler is not None else value


def _coerce_union(tp: Any, value: Any, key: str) -> Any:
    """``X | None`` (or a Union): None where None is allowed, else the first non-None member."""
    args = typing.get_args(tp)
    if value is None and type(None) in args:
        return None
    inner = [a for a in args if a is not type(None)]
    return _coerce(inner[0], value, key)


def _coerce_literal(tp: Any, value: Any, key: str) -> str:
    args = typing.get_args(tp)
    if isinstance(value, bool) and {"true", "false"} <= set(args):  # YAML reads true/false as booleans
        value = "true" if value else "false"
    text = _coerce_str(str, value, key)
    _choice(key, text, args)
    return text


def _coerce_device(tp: Any, value: Any, key: str) -> DeviceName:
    text = _coerce_str(str, value, key)
    try:
        return DeviceName(text)
    except ValueError:
        raise ConfigError(f"config '{key}': {text!r} is invalid, expected {DeviceName.expected()}") from None


def _coerce_list(tp: Any, value: Any, key: str) -> list[Any]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"config '{key}': expected a list, got {value!r}")
    item = typing.get_args(tp)[0]
    return [_coerce(item, v, key) for v in value]


def _coerce_dict(tp: Any, value: Any, key: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"config '{key}': expected a mapping, got {value!r}")
    return dict(value)


def _coerce_bool(tp: Any, value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"config '{key}': expected true or false, got {value!r}")


def _coerce_int(tp: Any, value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ConfigError(f"config '{key}': expected an integer, got {value!r}")
    return int(value)


def _coerce_float(tp: Any, value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"config '{key}': expected a number, got {value!r}")
    return float(value)


def _coerce_str(tp: Any, value: Any, key: str) -> str:
    import datetime

    if isinstance(value, datetime.date):  # YAML reads 2011-01-20 as a date
        return value.isoformat()
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"config '{key}': expected a string, got {value!r}")


# One handler per kind of target type: by its typing origin (``Literal[...]``, ``list[...]``, ``X | None``), else
# by the type itself (compared by identity, as ``tp is bool``); any other type takes the value as it is.
_Coercer = typing.Callable[[Any, Any, str], Any]
_BY_ORIGIN: dict[Any, _Coercer] = {
    typing.Union: _coerce_union,
    types.UnionType: _coerce_union,
    Literal: _coerce_literal,
    list: _coerce_list,
    dict: _coerce_dict,
}
_BY_TYPE: tuple[tuple[Any, _Coercer], ...] = (
    (DeviceName, _coerce_device),
    (bool, _coerce_bool),
    (int, _coerce_int),
    (float, _coerce_float),
    (str, _coerce_str),
)


def _choice(key: str, value: Any, allowed: typing.Iterable[str]) -> None:
    allowed = list(allowed)
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.5)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"config '{key}': {value!r} is not one of {', '.join(allowed)}{hint}")
