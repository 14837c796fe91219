"""Loading a run config: the defaults, then a YAML file, then ``section.key=value`` overrides, validated.

A config file is input: it is read with YAML's safe loader, bounded in size and in what its aliases
expand to, and an unknown key in it is named with the file.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from alchemetric_ray.config.coercion import _unknown_key, apply_overrides
from alchemetric_ray.config.schema import RunConfig
from alchemetric_ray.errors import ConfigError


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> RunConfig:
    """Defaults, then the YAML file (if any), then ``key=value`` overrides; validated."""
    raw: dict[str, Any] = RunConfig().to_dict()
    if path is not None:
        _merge(raw, _read_yaml(Path(path)), "", str(path))
    apply_overrides(raw, overrides)
    return RunConfig.from_dict(raw)


# A config file is input: bounded in size, and in what its YAML aliases may expand to (a few hundred
# bytes of nested aliases can stand for billions of values, the "billion laughs").
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ConfigError(f"config file {path}: not found")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path}: {path.stat().st_size} bytes, more than a config can be "
                          f"({MAX_CONFIG_BYTES} bytes)")
    try:
        text = path.read_text()
        _check_expansion(yaml.compose(text, Loader=yaml.SafeLoader), path)
        loaded = yaml.safe_load(text)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"config file {path}: not valid YAML ({first})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path}: expected a mapping of sections, got {type(loaded).__name__}")
    return loaded


def _check_expansion(root, path: Path) -> None:
    """Count the values the composed YAML stands for, every alias expanded, and refuse the file once
    they pass :data:`MAX_CONFIG_VALUES` (a cycle of aliases passes it too) before anything is built."""
    import yaml

    count, stack = 0, [root] if root is not None else []
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(f"config file {path}: its YAML aliases expand to more than {MAX_CONFIG_VALUES} values; "
                              "refusing it (write the values out, or use fewer nested aliases)")
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.extend((key, value))


def _merge(base: dict[str, Any], update: dict[str, Any], prefix: str, origin: str) -> None:
    for key, value in update.items():
        dotted = f"{prefix}{key}"
        if key not in base:
            raise ConfigError(_unknown_key(dotted, list(base), prefix, origin))
        if isinstance(base[key], dict) and isinstance(value, dict) and prefix == "":
            _merge(base[key], value, f"{dotted}.", origin)
        else:
            base[key] = value
