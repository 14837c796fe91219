"""The feature shards' manifest: what a shard folder holds, read and written here and nowhere else.

``manifest.json`` sits beside a shard folder's ``split=...`` folders and travels on into every
checkpoint and exported model, so a model always knows the feature columns, label, split dates
and normalization it was trained with.  Code reads it as a typed :class:`Manifest`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from alchemetric_ray.data.labels import LabelSpec
from alchemetric_ray.errors import ShardError
from alchemetric_ray.fsutil import atomic_write_json
from alchemetric_ray.storage import Location, locate

MANIFEST = "manifest.json"
READ_TIME_KEYS = frozenset({"window", "distributed", "group_rows"})  # features.* a run may set apart from the build
FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class Manifest:
    format_version: int = FORMAT_VERSION
    created: str = ""
    source: str | None = ""  # where the bars came from (a folder, a file or a named source; None: bars given as such)
    input_hash: str = ""  # hash of the ingested bars: same hash, same shards
    features: list[str]  # feature columns, in the order models read them
    label: dict[str, Any]  # LabelSpec's fields plus its classes and reach (bars)
    window: int | None = None  # sequence length the shards were built for
    splits: dict[str, Any]  # split dates and embargo (SplitPlan.as_dict)
    normalization: dict[str, Any]  # the normalizer fitted on train (Normalizer.as_dict)
    rows: dict[str, int]  # rows per split
    class_counts: dict[str, list[int]] = field(default_factory=dict)  # per split, in class order
    tickers: list[str] = field(default_factory=list)
    skipped_tickers: dict[str, str] = field(default_factory=dict)  # ticker -> why
    dropped_nonfinite_rows: int = 0
    ingest: dict[str, Any] | None = field(default_factory=dict)  # what ingest dropped and why (None: no files read)
    columns: dict[str, str] = field(default_factory=dict)
    # split -> its Parquet files, relative to the shard folder ("split=train/part-00000.parquet").
    # Readers read these and only these: on object storage, where a folder cannot be swapped in
    # whole, a file the manifest does not list (left by an older or an unfinished build) is ignored.
    # Empty in manifests written before the list existed: readers then take the split's folder.
    # "bars": the bars store's parts (data/bars_store.py), which `features --append` reads and adds to;
    # "tails": what an append resumes each ticker from (data/tails.py).  An append reads only the files listed
    # (in manifests from before a build listed them: every part in the folder).
    files: dict[str, list[str]] = field(default_factory=dict)
    # the per-date pass (data/cross_section.py): its operations, threshold and what it dropped;
    # empty when the label and features are per ticker only (and in manifests from before it)
    cross_section: dict[str, Any] = field(default_factory=dict)
    # the features.* settings the shards were built with (empty in manifests from before they were kept)
    built_with: dict[str, Any] = field(default_factory=dict)
    # how the features were computed: in the driver or as Ray tasks (tasks, groups, nodes), and timings
    build: dict[str, Any] = field(default_factory=dict)
    # each `features --append` in order: when, the dates and rows it added, the new bars' input hash
    appends: list[dict[str, Any]] = field(default_factory=list)

    @property
    def classes(self) -> list[str]:
        return list(self.label["classes"])

    @property
    def regression(self) -> bool:
        """A cross-sectional (real-valued) target, not classes."""
        return not self.label["classes"]

    @property
    def outputs(self) -> int:
        """The model's outputs: one logit per class, or one score for a regression target."""
        return len(self.label["classes"]) or 1

    @property
    def duplicates(self) -> dict[str, Any]:
        """How ingest treated duplicated bars (``ingest["duplicates"]``, IngestReport.duplicates in
        bars/report.py: exact_rows_dropped, conflicting_dates, conflicting_rows_dropped, resolved_by,
        tickers_skipped), so a reader need not know where the counts sit.  Empty where nothing was
        ingested from files (synthetic, builtin) and in manifests written before they were counted."""
        return dict((self.ingest or {}).get("duplicates") or {})

    @property
    def label_spec(self) -> LabelSpec:
        return LabelSpec.from_manifest(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def skipped(self) -> dict[str, str]:
        """Every ticker left out, with why: by ingest (an empty or too short file, duplicates) and by
        the features (too short once the indicators warmed up)."""
        return {**dict((self.ingest or {}).get("skipped_tickers") or {}), **self.skipped_tickers}

    def notes(self) -> list[str]:
        """What a person should know of the build, one line each: every skipped ticker (its file) and
        the rows ingest dropped, by rule; nothing where there is nothing to say."""
        lines = []
        skipped = self.skipped()
        if skipped:
            lines.append(f"skipped {len(skipped)} ticker(s): "
                         + "; ".join(f"{ticker} ({why})" for ticker, why in skipped.items()))
        dropped = {rule: n for rule, n in ((self.ingest or {}).get("dropped") or {}).items() if n}
        if dropped:
            lines.append("dropped rows: " + ", ".join(f"{rule}={n}" for rule, n in dropped.items()))
        return lines

    def feature_settings(self) -> dict[str, Any]:
        """``features.*`` key -> the value the shards were built with: every build setting where the
        manifest keeps them, else those its label and columns record.  ``features.window`` is not one:
        sequences are cut as the files are read, so a run chooses its own."""
        label = {("label" if name == "scheme" else name): self.label[name]
                 for name in LabelSpec.__dataclass_fields__ if name in self.label}
        kept = {"set": "basic", **{key: value for key, value in self.built_with.items() if key not in READ_TIME_KEYS}}
        return {**kept, **label, "names": list(self.features)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = MANIFEST) -> Manifest:
        if raw.get("format_version") != FORMAT_VERSION:
            raise ShardError(f"{where}: format_version {raw.get('format_version')!r}, expected {FORMAT_VERSION}")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as exc:  # a required key is missing
            raise ShardError(f"{where}: not a complete manifest ({exc})") from None

    @classmethod
    def read(cls, folder: str | Path | Location) -> Manifest:
        """The manifest of a shard folder or an exported model's folder (local or on object storage)."""
        path = locate(folder) / MANIFEST
        if not path.is_file():
            raise ShardError(f"{folder}: no {MANIFEST} (not a feature-shard folder; run `alchemetric-ray features` "
                             "first)")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ShardError(f"{path}: not valid JSON ({exc.__class__.__name__})") from None
        return cls.from_dict(raw, str(path))

    def write(self, folder: str | Path) -> None:
        atomic_write_json(Path(folder) / MANIFEST, self.to_dict())


def reconcile_features(cfg, manifest: Manifest, shards: str | Location, *, model: bool = False,
                       appending: bool = False):
    """``cfg`` with the shards' own ``features.*`` settings, so that a model's saved config says what
    it was trained on.  A key left at its default takes the shards' value; a key the run set to a
    value the shards were not built with is refused in one line naming each key, both values and
    the remedy (rebuild the shards, or drop the override).  ``model``: ``shards`` is a saved model's
    folder (whose manifest is that of the shards it was trained on); ``appending``: the settings of
    ``features --append`` to ``shards``, which keeps the shards' own."""
    from alchemetric_ray.config import FeaturesConfig
    from alchemetric_ray.data.features import resolve_feature_names

    default = FeaturesConfig()
    adopt, conflicts = {}, []
    for key, built in manifest.feature_settings().items():
        if not hasattr(cfg.features, key):
            continue
        asked = getattr(cfg.features, key)
        if key == "names":
            asked = resolve_feature_names(asked, cfg.features.set)
            left_default = cfg.features.names == default.names
        else:
            left_default = asked == getattr(default, key)
        if asked == built or (isinstance(built, float) and asked == float(built)):
            continue
        if left_default:
            adopt[key] = built
        else:
            conflicts.append((key, asked, built))
    if conflicts:
        asked = [f"features.{key}={_text(value)}" for key, value, _ in conflicts]
        built = ", ".join(f"features.{key}={_text(value)}" for key, _, value in conflicts)
        if appending:
            raise ShardError(f"the shards in {shards} were built with {built}, but this append asks for "
                             f"{', '.join(asked)}: drop the override (an append keeps the shards' own settings), or "
                             f"build new shards with it (alchemetric-ray features --out NEW_DIR {' '.join(asked)})")
        if model:
            raise ShardError(f"the model in {shards} was trained on features with {built}, but this command asks for "
                             f"{', '.join(asked)}: drop the override, or train a model on features built with "
                             f"{' '.join(asked)}")
        raise ShardError(f"the shards in {shards} were built with {built}, but this run asks for {', '.join(asked)}: "
                         f"rebuild the features with those settings (alchemetric-ray features --out NEW_DIR "
                         f"{' '.join(asked)}) and train on them, or drop the override to train on these shards")
    if not adopt:
        return cfg
    raw = cfg.to_dict()
    raw["features"].update(adopt)
    return type(cfg).from_dict(raw)


def with_shard_features(cfg, manifest: Manifest):
    """``cfg`` with every ``features.*`` setting the shards record: a saved model's config as it was
    trained, even one saved before configs were reconciled with their shards."""
    raw = cfg.to_dict()
    raw["features"].update({key: value for key, value in manifest.feature_settings().items() if key in raw["features"]})
    return type(cfg).from_dict(raw)


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else "null" if value is None else str(value)
