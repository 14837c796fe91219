"""How a setting and a rule across settings are declared, and how both are checked.

Each field of a section is a ``setting``: its default, its help text and, where one value alone can
be wrong, its ``Check``.  A rule across fields is a function registered with ``@rule`` (the rules
themselves are ``config.rules``).  ``validate`` runs every field's check, then every rule, and
raises the one-line :class:`ConfigError`.  The reference (docs/configuration.md,
``config_reference``), validation and the CLI's help read these; a choice's allowed values are its
Literal type (``config.vocabulary``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from alchemetric_ray.errors import ConfigError


@dataclass(frozen=True)
class Check:
    """A single-field check: ``ok(value)`` must hold; ``expected`` says what is wanted (in the error
    message and the reference).  A None value of an optional field is never checked."""

    ok: Callable[[Any], bool]
    expected: str


def at_least(low: float, zero: str = "") -> Check:
    """``value >= low``; ``zero`` says what the lowest value means (``0 = automatic``)."""
    return Check(lambda value: value >= low, f">= {low}" + (f" ({zero})" if zero else ""))


def above(low: float) -> Check:
    return Check(lambda value: value > low, f"> {low}")


def setting(default: Any = None, help: str = "", *, check: Check | None = None,
            factory: Callable[[], Any] | None = None) -> Any:
    """A config field: its default (or ``factory`` for a mutable one), help text and optional check."""
    metadata = {"help": help, "check": check}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


A_DATE = Check(lambda value: _is_date(value), "a date YYYY-MM-DD")
A_PLAIN_NAME = Check(lambda value: _safe_name(value), "a plain name of letters, digits, '.', '_' or '-' "
                                                      "(no path separators or '..')")


# --------------------------------------------------------------------------------------------
# Validation: a choice is a Literal type, checked as it is built (``config.coercion``); a single-field
# check lives on its field (``setting(..., check=...)``); a rule across fields is registered here,
# naming its fields.  Every message is one line naming the key and the value.
# --------------------------------------------------------------------------------------------

# A rule's test: the message's text for a RunConfig that breaks the rule, or None.
Problem = Callable[[Any], str | None]


@dataclass(frozen=True)
class Rule:
    """A rule across fields: ``keys`` are the fields it reads (the first is the one its message names),
    ``says`` is the rule in words (for the reference), ``problem(cfg)`` the message's text, or None."""

    keys: tuple[str, ...]
    says: str
    problem: Problem


RULES: list[Rule] = []


def rule(*keys: str, says: str) -> Callable[[Problem], Problem]:
    def register(fn: Problem) -> Problem:
        RULES.append(Rule(keys, says, fn))
        return fn

    return register


def validate(cfg: Any) -> None:
    """Every field's own check of a RunConfig (section by section, in field order), then every rule across
    fields, in the order they were declared."""
    for section in dataclasses.fields(cfg):
        values = getattr(cfg, section.name)
        for f in dataclasses.fields(values):
            check, value = f.metadata.get("check"), getattr(values, f.name)
            if check is not None and value is not None and not check.ok(value):
                raise ConfigError(f"config '{section.name}.{f.name}': {value!r} is invalid, expected {check.expected}")
    for each in RULES:
        problem = each.problem(cfg)
        if problem:
            raise ConfigError(f"config '{each.keys[0]}': {problem}")


def _is_date(value: str) -> bool:
    import datetime

    try:
        datetime.date.fromisoformat(str(value))
        return True
    except ValueError:
        return False


def _safe_name(name: str) -> bool:
    import re

    return bool(re.fullmatch(r"[A-Za-z0-9_.-]+", name or "")) and name not in (".", "..")
