"""Known backend bugs as data (``known_bugs.yaml``), checked by rule on the run itself.

Each entry names a backend (``mps``, ``cuda``, ``cpu``), the GPU families it hits (None: all), the
torch releases it affects (``affected_from <= torch < fixed_in``; ``fixed_in: null`` = no release fixes
it), a trigger rule, the symptom, its source with a reproducer, the remedy, and a workaround the code
can apply exactly (or none: a matching run is refused).

The shape rules are evaluated on a trace of the run's own step: the configured model is built on the
``meta`` device (no memory), and one forward and backward at the real per-step batch shape runs under
a ``TorchDispatchMode`` that records every ``mm``/``addmm``/``bmm``/``baddbmm`` (its reduction
dimension K and output dimensions) and every dtype it meets (:func:`trace_step`).  The trace shows
torch's generic decomposition of each layer; a backend's own kernels for a layer may multiply other
shapes: what the trace cannot represent (MPS's LSTM/GRU kernels, convolutions) is reported as
"unknown: probe" for the entries of that backend (the doctor probes them), never as safe.  Each
trigger kind is one :class:`Rule` in :data:`RULES`: how its entries are matched, and what the trace
and the micro-batch workaround need to know of them.

Nothing here knows the models or the loop: the caller builds the model and the loss
(``train/backend_check.py``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast, overload

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from alchemetric_ray.hardware import device as device_probes
from alchemetric_ray.hardware import inventory

TABLE = Path(__file__).with_name("known_bugs.yaml")
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm")
WORKAROUNDS = ("micro_batches",)
# Layers whose kernels on some backends are not the generic decomposition the trace records.
OPAQUE_LAYERS: tuple[type[nn.Module], ...] = (nn.RNNBase, nn.modules.conv._ConvNd)


@overload
def _version(text: str) -> tuple[int, ...]: ...
@overload
def _version(text: None) -> None: ...
@overload
def _version(text: str | None) -> tuple[int, ...] | None: ...
def _version(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    return tuple(int(p) for p in re.findall(r"\d+", str(text).split("+")[0])[:3])


@dataclass(frozen=True)
class Entry:
    """One row of the table (see the module docstring and the YAML file's header)."""

    id: str
    backend: str
    devices: tuple[str, ...] | None
    affected_from: str
    fixed_in: str | None
    trigger: dict[str, Any]
    symptom: str
    source: str
    reproducer: str
    remedy: str
    workaround: str | None
    silent: bool

    @property
    def kind(self) -> str:
        return self.trigger["kind"]

    @property
    def rule(self) -> Rule:
        """How this entry's trigger is evaluated (:data:`RULES`)."""
        return RULES[self.kind]

    @property
    def versions(self) -> str:
        until = "now (no fix released)" if self.fixed_in is None else f"< {self.fixed_in}"
        return f"torch {self.affected_from} to {until}"

    @property
    def reference(self) -> str:
        """``pytorch/pytorch#193487`` from the source's URL (the URL itself if it is not GitHub's)."""
        found = re.match(r"https://github.com/([^/]+/[^/]+)/(?:issues|pull)/(\d+)", self.source)
        return f"{found.group(1)}#{found.group(2)}" if found else self.source

    def affects_torch(self, version: tuple[int, ...]) -> bool:
        low, high = _version(self.affected_from), _version(self.fixed_in)
        return version >= low and (high is None or version < high)

    def applies(self, backend: "Backend") -> bool | None:
        """True: this backend, family and torch are affected; False: not; None: the family is unknown."""
        if backend.kind != self.backend or not self.affects_torch(backend.torch):
            return False
        if self.devices is None:
            return True
        if backend.family is None:
            return None
        return backend.family in self.devices


@functools.lru_cache(maxsize=1)
def entries() -> tuple[Entry, ...]:
    """The table, validated: a malformed entry is a bug of this package, so it raises ValueError."""
    import yaml

    rows = yaml.safe_load(TABLE.read_text())
    found = []
    for row in rows:
        row = dict(row)
        row["devices"] = tuple(row["devices"]) if row.get("devices") else None
        entry = Entry(**row)
        where = f"{TABLE.name}: entry {entry.id}"
        if entry.kind not in TRIGGER_KINDS:
            raise ValueError(f"{where}: trigger kind {entry.kind!r} is not one of {TRIGGER_KINDS}")
        if entry.workaround is not None and entry.workaround not in WORKAROUNDS:
            raise ValueError(f"{where}: workaround {entry.workaround!r} is not one of {WORKAROUNDS}")
        problem = entry.rule.problem(entry) if entry.rule.problem else None
        if problem:
            raise ValueError(f"{where}: {problem}")
        found.append(entry)
    if len({e.id for e in found}) != len(found):
        raise ValueError(f"{TABLE.name}: two entries share an id")
    return tuple(found)


def entry(entry_id: str) -> Entry:
    return next(e for e in entries() if e.id == entry_id)


# ---- the backend a run trains on ------------------------------------------------------------


_APPLE_FAMILY = {"1": "Apple7", "2": "Apple8", "3": "Apple9", "4": "Apple9", "5": "Apple10"}


def apple_gpu_family(chip: str | None) -> str | None:
    """``"Apple M1 Pro"`` -> ``"Apple7"`` (M1 = Apple7, M2 = Apple8, M3 and M4 = Apple9, M5 = Apple10);
    None for anything else (an unknown chip is not assumed safe: entries say "family unknown")."""
    found = re.search(r"\bM(\d+)\b", chip or "")
    return _APPLE_FAMILY.get(found.group(1)) if found and "Apple" in (chip or "") else None


def _apple_gpu(device: torch.device) -> tuple[str | None, str | None]:
    chip = inventory.cpu_model()
    return apple_gpu_family(chip), chip


def _nvidia_gpu(device: torch.device) -> tuple[str | None, str | None]:
    index = device.index or 0
    major, minor = device_probes.cuda_capability(index)
    return f"sm_{major}{minor}", device_probes.cuda_name(index)


def _host(device: torch.device) -> tuple[str | None, str | None]:
    return None, inventory.cpu_model()


@dataclass(frozen=True)
class _Gpus:
    """How the GPU family of one device kind is told, for the entries that name families."""

    read: Callable[[torch.device], tuple[str | None, str | None]]  # (family, the device's name)
    may_be_unknown: bool  # told from the chip's name, which may be one this module does not know


# The kinds whose GPUs have families (a Mac's from its chip's name, CUDA's from the compute capability).
_GPUS = {"mps": _Gpus(_apple_gpu, may_be_unknown=True), "cuda": _Gpus(_nvidia_gpu, may_be_unknown=False)}
_NO_GPUS = _Gpus(_host, may_be_unknown=False)


_TorchDevice = torch.device  # for Backend's annotations, where "torch" names its field


@dataclass(frozen=True)
class Backend:
    """What an entry is matched against: the device kind, its GPU family where known, torch's version."""

    kind: str
    torch: tuple[int, ...]
    family: str | None = None
    name: str | None = None

    @classmethod
    def of(cls, device: _TorchDevice | str) -> Backend:
        """The backend of ``device`` in this process (the chip's name from the OS on a Mac)."""
        device = torch.device(device)
        family, name = _GPUS.get(device.type, _NO_GPUS).read(device)
        return cls(device.type, _version(torch.__version__), family, name)

    def __str__(self) -> str:
        where = self.name or self.kind
        unknown = _GPUS.get(self.kind, _NO_GPUS).may_be_unknown
        family = f", {self.family}" if self.family else (", GPU family unknown" if unknown else "")
        return f"{self.kind} ({where}{family}), torch {'.'.join(map(str, self.torch))}"


# ---- tracing the run's step ------------------------------------------------------------------


@dataclass(frozen=True)
class Matmul:
    op: str
    m: int
    k: int
    n: int
    batch: int  # bmm/baddbmm's batch dimension; 1 for mm/addmm
    dtype: str

    def __str__(self) -> str:
        lead = f"{self.batch} x " if self.op in ("bmm", "baddbmm") else ""
        return f"{self.op} {lead}({self.m}, {self.k}) @ ({self.k}, {self.n}), K = {self.k:,}"


@dataclass
class Trace:
    """What one traced step multiplied and which dtypes it met, and the layers it cannot see into."""

    rows: int  # the batch rows the step was traced at
    matmuls: list[Matmul] = field(default_factory=list)
    dtypes: set[str] = field(default_factory=set)
    opaque: list[str] = field(default_factory=list)  # "rnn (LSTM)", "net.0.conv (Conv1d)"
    modules: list[tuple[str, str, int, float]] = field(default_factory=list)  # (name, class, num_layers, dropout)


class _Recorder(TorchDispatchMode):
    def __init__(self, trace: Trace):
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        self.trace.dtypes.update(str(t.dtype).replace("torch.", "") for t in tensors)
        if name in MATMUL_OPS:
            a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
            batch = a.shape[0] if a.dim() == 3 else 1
            self.trace.matmuls.append(Matmul(name, int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1]), int(batch),
                                             str(a.dtype).replace("torch.", "")))
        out = func(*args, **kwargs)
        self.trace.dtypes.update(str(t.dtype).replace("torch.", "")
                                 for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def _dropout(module: nn.Module) -> float:
    """A layer's own dropout setting (nn.LSTM's ``dropout`` between layers), 0 where it has none."""
    value = getattr(module, "dropout", 0.0)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def trace_step(module: nn.Module, step: Callable[[nn.Module], torch.Tensor], rows: int) -> Trace:
    """Record one forward and backward: ``step(module)`` returns the loss (``module`` and the batch
    ``step`` makes should be on the ``meta`` device, so that nothing is computed or allocated)."""
    trace = Trace(rows)
    trace.opaque = [f"{name or 'model'} ({type(m).__name__})" for name, m in module.named_modules()
                    if isinstance(m, OPAQUE_LAYERS)]
    trace.modules = [(name or "model", type(m).__name__, int(getattr(m, "num_layers", 1)), _dropout(m))
                     for name, m in module.named_modules()]
    with _Recorder(trace):
        loss = step(module)
        params = [p for p in module.parameters() if p.requires_grad]
        if params and loss.requires_grad:
            torch.autograd.grad(loss, params, allow_unused=True)
    return trace


# ---- evaluating the rules --------------------------------------------------------------------


@dataclass(frozen=True)
class RunTraits:
    """What a rule may ask about the run besides its trace: its precision and optimizer."""

    grad_scaler: bool = False
    fused_optimizer: bool = False


@dataclass(frozen=True)
class Match:
    entry: Entry
    evidence: str  # what in the run meets the trigger
    calls: tuple[Matmul, ...] = ()
    family_unknown: bool = False

    def line(self, backend: Backend) -> str:
        family = "; the GPU family is unknown, so it may apply" if self.family_unknown else ""
        return (f"known backend bug {self.entry.id} ({self.entry.reference}) on {backend}: {self.evidence}{family}; "
                f"{self.entry.remedy}")


@dataclass(frozen=True)
class Unknown:
    entry: Entry
    why: str


@dataclass
class Findings:
    """The table against one backend and one run: what matches, what the trace cannot tell (probe it),
    and what applies here but has no rule to evaluate."""

    backend: Backend
    matched: list[Match] = field(default_factory=list)
    unknown: list[Unknown] = field(default_factory=list)
    not_evaluable: list[Entry] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"backend": str(self.backend),
                "matched": [{"id": m.entry.id, "source": m.entry.source, "evidence": m.evidence,
                             "workaround": m.entry.workaround} for m in self.matched],
                "unknown": [{"id": u.entry.id, "source": u.entry.source, "why": u.why} for u in self.unknown],
                "not_evaluable": [e.id for e in self.not_evaluable]}


def _matmul_hits(entry: Entry, trace: Trace) -> list[Matmul]:
    rule = entry.trigger
    k_max = rule.get("k_max")
    return [c for c in trace.matmuls
            if c.op in rule["ops"] and c.k >= rule["k_min"] and (k_max is None or c.k <= k_max)
            and min(c.m, c.n) >= rule.get("min_out", 1)
            and (not rule.get("dtypes") or c.dtype in rule["dtypes"])]


def _module_hit(entry: Entry, trace: Trace) -> str | None:
    """What in the model meets a ``module`` trigger (None: nothing)."""
    rule = entry.trigger
    for name, cls, layers, dropout in trace.modules:
        if cls not in rule["types"] or layers < rule.get("min_layers", 1):
            continue
        if rule.get("dropout") and not dropout > 0:
            continue
        if trace.rows < rule.get("min_rows", 0):
            continue
        parts = [f"{layers} layers"] if "min_layers" in rule else []
        parts += [f"dropout {dropout:g}"] if rule.get("dropout") else []
        parts += [f"{trace.rows:,} rows a step"] if "min_rows" in rule else []
        return f"the model's {name} is a {cls}" + (f" ({', '.join(parts)})" if parts else "")
    return None


def _matmul_match(e: Entry, trace: Trace, backend: Backend, traits: RunTraits,
                  family_unknown: bool) -> Match | Unknown | None:
    hits = _matmul_hits(e, trace)
    if hits:
        worst = max(hits, key=lambda c: c.k)
        more = f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
        return Match(e, f"the step at {trace.rows:,} rows runs {worst}{more}", tuple(hits), family_unknown)
    if trace.opaque:
        return Unknown(e, f"{', '.join(trace.opaque)} run {backend.kind}'s own kernels, whose "
                          "matmul shapes the trace cannot see: unknown: probe")
    return None


def _dtype_match(e: Entry, trace: Trace, backend: Backend, traits: RunTraits, family_unknown: bool) -> Match | None:
    hit = sorted(trace.dtypes & set(e.trigger["dtypes"]))
    return Match(e, f"the step computes in {', '.join(hit)}", (), family_unknown) if hit else None


def _module_match(e: Entry, trace: Trace, backend: Backend, traits: RunTraits, family_unknown: bool) -> Match | None:
    hit = _module_hit(e, trace)
    return Match(e, hit, (), family_unknown) if hit else None


def _precision_match(e: Entry, trace: Trace | None, backend: Backend, traits: RunTraits,
                     family_unknown: bool) -> Match | None:
    if traits.grad_scaler and e.trigger.get("grad_scaler"):
        return Match(e, "the precision uses a GradScaler", (), family_unknown)
    return None


def _optimizer_match(e: Entry, trace: Trace | None, backend: Backend, traits: RunTraits,
                     family_unknown: bool) -> Match | None:
    if traits.fused_optimizer and e.trigger.get("fused"):
        return Match(e, "the optimizer is a fused one", (), family_unknown)
    return None


def _ops_problem(e: Entry) -> str | None:
    return None if set(e.trigger["ops"]) <= set(MATMUL_OPS) else f"ops must be among {MATMUL_OPS}"


@dataclass(frozen=True)
class Rule:
    """How the entries of one trigger kind (``trigger.kind`` in the YAML file) are evaluated."""

    kind: str
    # (entry, trace, backend, run traits, family unknown) -> what the run meets, or None; None: no rule to evaluate.
    # The trace is a Trace, or None for a rule not on_trace (evaluate() skips those without a trace)
    match: Callable[[Entry, Any, Backend, RunTraits, bool], Match | Unknown | None] | None
    on_trace: bool = False  # judged on the traced step: not evaluable without a run (``env``)
    bounds_k: bool = False  # a matched call's K reaches the entry's k_min: micro-batches can keep it below
    bounds_rows: bool = False  # an entry may name min_rows, the step's rows from which it applies
    problem: Callable[[Entry], str | None] | None = None  # what is wrong with an entry of this kind, if anything

    @property
    def evaluable(self) -> bool:
        return self.match is not None


RULES: dict[str, Rule] = {rule.kind: rule for rule in (
    Rule("matmul", _matmul_match, on_trace=True, bounds_k=True, problem=_ops_problem),
    Rule("dtype", _dtype_match, on_trace=True),
    Rule("precision", _precision_match),
    Rule("optimizer", _optimizer_match),
    Rule("module", _module_match, on_trace=True, bounds_rows=True),
    Rule("none", None),
)}
TRIGGER_KINDS = tuple(RULES)


def evaluate(trace: Trace | None, backend: Backend, traits: RunTraits = RunTraits()) -> Findings:
    """Every entry that applies to ``backend``, matched against the run (``trace`` None: rules on shapes
    and dtypes are not evaluated, as for ``env``, which has no run)."""
    found = Findings(backend)
    for e in entries():
        applies = e.applies(backend)
        if applies is False:
            continue
        rule = e.rule
        if not rule.evaluable or (trace is None and rule.on_trace):
            found.not_evaluable.append(e)
            continue
        match = cast(Callable[..., Match | Unknown | None], rule.match)  # evaluable: not None
        result = match(e, trace, backend, traits, applies is None)
        if isinstance(result, Match):
            found.matched.append(result)
        elif isinstance(result, Unknown):
            found.unknown.append(result)
    return found


def rows_below(matches: list[Match], trace: Trace, backend: Backend) -> int | None:
    """The most rows a micro-batch may hold so that no matmul of the matched calls reaches the lowest
    ``k_min`` of the matmul entries that apply to ``backend``, from how K grows with the rows in
    ``trace`` (K = rows, or rows x window through a Linear over a sequence); None when a matched K
    does not grow with the rows (the workaround cannot help)."""
    k_limit = min((e.trigger["k_min"] for e in entries() if e.rule.bounds_k and e.applies(backend) is not False),
                  default=None)
    limit = None
    for m in matches:
        if m.entry.rule.bounds_rows and "min_rows" in m.entry.trigger:
            rows = m.entry.trigger["min_rows"] - 1
            limit = rows if limit is None else min(limit, rows)
            continue
        for call in m.calls:
            per_row = call.k / trace.rows
            if k_limit is None or call.k % trace.rows or per_row < 1:
                return None
            rows = int((k_limit - 1) // per_row)
            limit = rows if limit is None else min(limit, rows)
    return limit


def applicable_here(backends: list[Backend]) -> list[tuple[Entry, Backend, bool | None]]:
    """(entry, backend, applies) for every entry that applies (or may: family unknown) to one of ``backends``."""
    out: list[tuple[Entry, Backend, bool | None]] = []
    for b in backends:
        for e in entries():
            applies = e.applies(b)
            if applies is not False:
                out.append((e, b, applies))
    return out


def cuda_worker_bugs() -> dict:
    """The table's entries for this process's first CUDA GPU and torch (the GPU preflight adds them to
    :func:`~alchemetric_ray.hardware.device.gpu_worker_report`); empty where torch has no CUDA here."""
    if not (device_probes.cuda_available() and device_probes.cuda_count() > 0):
        return {}
    backend = Backend.of(torch.device("cuda", 0))
    return {"backend": str(backend),
            "known_bugs": [f"{e.id} ({e.reference})" for e, _, _ in applicable_here([backend])]}
