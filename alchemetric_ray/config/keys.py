"""The reference of every config key, read from the fields: one row per key with its type, default,
allowed values (its Literal type or its check) and help text, and one line per section.

``config_reference`` renders these rows, and the rules across keys, as docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from alchemetric_ray.config.schema import RunConfig
from alchemetric_ray.config.settings import Check
from alchemetric_ray.config.vocabulary import DeviceName

REFERENCE_DOC = "docs/configuration.md"  # in the repository; `python -m alchemetric_ray.config_reference` prints it


@dataclass(frozen=True)
class Setting:
    """One key of the reference: what `docs/configuration.md` and the checks on it read."""

    section: str
    key: str
    type: str
    default: str
    allowed: str
    help: str

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"


def sections() -> list[tuple[str, str]]:
    """(section name, what it configures) for every section of :class:`RunConfig`, in order."""
    out = []
    for section in dataclasses.fields(RunConfig):
        cls: Any = section.default_factory  # every section defaults to its dataclass
        out.append((section.name, " ".join((cls.__doc__ or "").split())))
    return out


def reference() -> list[Setting]:
    """Every key of every section: its type, default, allowed values and help, in field order."""
    rows = []
    for section in dataclasses.fields(RunConfig):
        cls: Any = section.default_factory  # every section defaults to its dataclass
        hints = typing.get_type_hints(cls)
        defaults = cls()
        for f in dataclasses.fields(cls):
            check = f.metadata.get("check")
            rows.append(Setting(section.name, f.name, _type_name(hints[f.name]), _value_text(getattr(defaults, f.name)),
                                _allowed(hints[f.name], check), f.metadata.get("help", "")))
    return rows


def _type_name(tp: Any) -> str:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{_type_name(inner[0])} or null"
    if typing.get_origin(tp) is Literal:
        return "choice"
    if typing.get_origin(tp) is list:
        return f"list of {_type_name(args[0])}s"
    names = {DeviceName: "device name", bool: "boolean", int: "integer", float: "number", str: "string",
             dict: "mapping"}
    return names.get(typing.get_origin(tp) or tp, str(tp))


def _allowed(tp: Any, check: Check | None) -> str:
    if typing.get_origin(tp) is Literal:
        return ", ".join(typing.get_args(tp))
    if tp is DeviceName:
        return DeviceName.expected()
    return check.expected if check else ""


def _value_text(value: Any) -> str:
    """A default as a user writes it in YAML or an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)
