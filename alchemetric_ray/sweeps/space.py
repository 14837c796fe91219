"""The search space: ``tune.space`` checked and turned into Tune's param space, and how many trials it makes.

Each kind of entry (``{loguniform: [low, high]}``, ``{choice: [...]}``, ...) is one ``SpecKind``
record in ``SPEC_KINDS``: whether it lists values or gives a range, whether its values are grid
points, and, for a range, what Tune samples.  A bare list is a ``grid`` with ``tune.search=grid``
and a ``choice`` otherwise; any other bare value is fixed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import ConfigError


@dataclass(frozen=True)
class SpecKind:
    """One kind of ``tune.space`` entry."""

    listed: bool = False  # a non-empty list of values (grid, choice), not [low, high]
    grid: bool = False  # every listed value is a grid point, whatever tune.search is
    positive: bool = False  # a range whose low end must be above 0 (sampled on a log scale)
    sample: Callable[[Any, list], Any] | None = None  # (ray.tune, [low, high(, q)]) -> Tune's domain of a range

    def is_grid(self, search: str) -> bool:
        """Whether the listed values are grid points (a trial each) rather than a choice to sample."""
        return self.listed and (self.grid or search == "grid")


SPEC_KINDS: dict[str, SpecKind] = {
    "loguniform": SpecKind(positive=True, sample=lambda tune, args: tune.loguniform(args[0], args[1])),
    "uniform": SpecKind(sample=lambda tune, args: tune.uniform(args[0], args[1])),
    "choice": SpecKind(listed=True),
    "grid": SpecKind(listed=True, grid=True),
    "randint": SpecKind(sample=lambda tune, args: tune.randint(args[0], args[1])),
    "quniform": SpecKind(sample=lambda tune, args: tune.quniform(args[0], args[1], args[2] if len(args) == 3 else 1)),
}


def build_space(cfg: RunConfig) -> dict[str, Any]:
    """Turn ``tune.space`` ({"train.lr": {"loguniform": [1e-4, 1e-2]}, ...}) into Tune's param space."""
    from ray import tune

    space = cfg.tune.space
    if not space:
        raise ConfigError("config 'tune.space' is empty: name at least one hyperparameter, "
                          "e.g. tune.space={train.lr: {loguniform: [0.0001, 0.01]}}")
    out: dict[str, Any] = {}
    for key, spec in space.items():
        _known_key(cfg, key)
        if isinstance(spec, list):
            spec = {"grid" if cfg.tune.search == "grid" else "choice": spec}
        if not isinstance(spec, dict):
            cfg.with_values({key: spec})
            out[key] = spec  # a fixed value
            continue
        if len(spec) != 1 or next(iter(spec)) not in SPEC_KINDS:
            raise ConfigError(f"config 'tune.space.{key}': {spec!r} must be one of "
                              + ", ".join(f"{{{k}: ...}}" for k in SPEC_KINDS))
        out[key] = _domain(cfg, key, *next(iter(spec.items())), tune)
    return out


def _domain(cfg: RunConfig, key: str, name: str, args: Any, tune) -> Any:
    """Tune's domain of one entry ``{name: args}`` of the space, its values checked against ``key``."""
    kind = SPEC_KINDS[name]
    if cfg.tune.search == "grid" and not kind.listed:
        raise ConfigError(f"config 'tune.space.{key}': tune.search=grid needs a list of values, got {name}")
    if kind.listed:
        if not isinstance(args, list) or not args:
            raise ConfigError(f"config 'tune.space.{key}': {name} needs a non-empty list")
        for value in args:
            cfg.with_values({key: value})
        return tune.grid_search(args) if kind.is_grid(cfg.tune.search) else tune.choice(args)
    if not (isinstance(args, list) and len(args) in (2, 3) and all(isinstance(a, (int, float)) for a in args)):
        raise ConfigError(f"config 'tune.space.{key}': {name} needs [low, high], got {args!r}")
    lo, hi = args[0], args[1]
    need, ok = ("0 < low < high", 0 < lo < hi) if kind.positive else ("low < high", lo < hi)
    if not ok:
        raise ConfigError(f"config 'tune.space.{key}': {name} [{lo}, {hi}] needs {need}")
    cfg.with_values({key: lo})
    cfg.with_values({key: hi})
    sample = cast(Callable[[Any, list], Any], kind.sample)  # cast: every range kind (not listed) has a sample
    return sample(tune, args)


def _known_key(cfg: RunConfig, key: str) -> None:
    section, _, name = key.partition(".")
    current = cfg.to_dict().get(section, {}).get(name, None) if section in cfg.to_dict() else None
    cfg.with_values({key: current})  # raises the did-you-mean error for an unknown key


def trial_count(cfg: RunConfig) -> int:
    """How many trials the sweep runs: tune.num_samples times the grid's points (with tune.search=grid
    every list in the space is a grid; otherwise only ``{grid: [...]}`` entries are)."""
    points = 1
    for spec in cfg.tune.space.values():
        if isinstance(spec, list) and cfg.tune.search == "grid":
            points *= len(spec)
        elif isinstance(spec, dict) and len(spec) == 1:
            name, args = next(iter(spec.items()))
            kind = SPEC_KINDS.get(name)
            if kind is not None and kind.is_grid(cfg.tune.search) and isinstance(args, list):
                points *= len(args)
    return max(1, points * (1 if cfg.tune.search == "grid" else cfg.tune.num_samples))


def values_of(spec: Any, default: str) -> list[str]:
    """The values an entry of the space can take (a fixed one, a list, or a kind's list), as text;
    ``[default]`` where the space does not name the key."""
    if spec is None:
        return [default]
    if isinstance(spec, list):
        return [str(v) for v in spec]
    if isinstance(spec, dict):
        return [str(v) for v in next(iter(spec.values()))]
    return [str(spec)]
