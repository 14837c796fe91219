"""Ask the autoscaler for a run's workers, wait for them visibly, check the GPUs, always clean up.

``with scale_up(cfg, plan, bundles):`` wraps a whole ``fit()`` (``run_training``) or sweep
(``run_sweep``):

1. on an autoscaling plan, ``ray.autoscaler.sdk.request_resources(bundles=...)`` asks for the
   workers' bundles (and Ray Data's CPU where it needs a node of its own) at once, past the
   autoscaler's upscaling speed;
2. a GPU plan sends one preflight task per planned GPU worker (``num_gpus`` as a worker holds, so it
   also triggers the scale-up); each reports its node, ``CUDA_VISIBLE_DEVICES``, ``torch.version.cuda``
   and ``torch.cuda.is_available()``, and a node whose torch cannot use the GPU stops the run with one
   line (the judgement is ``hardware``'s);
3. it waits until the bundles fit on the nodes that are up, printing every
   :data:`PROGRESS_INTERVAL_S` what is asked, what is up and the time, e.g.
   ``waiting for 4 x {CPU: 8, GPU: 1}: 1 of 4 up, 3m10s``; at the deadline a :class:`StartTimeout`
   (one line, exit 2) names what never came;
4. the request persists until overridden, so on the way out (success, failure, timeout, Ctrl-C)
   ``request_resources(bundles=[])`` clears it.

The v1 autoscaler holds a single standing request for the whole cluster, and Ray Data's own
autoscaling coordinator writes it too (its requests, renewed every 20 s while a dataset runs,
expire after 180 s): the wait asks again every :data:`REASK_INTERVAL_S`, and the clear at the end
may also drop another job's request until that job renews it.

The start timeout (``scaling.start_timeout_s``; 0 = :data:`DEFAULT_START_TIMEOUT_S`, or
:data:`AUTOSCALING_START_TIMEOUT_S` on an autoscaling plan) is the TOTAL wait.  Our own wait above
covers the scale-up and the preflight; what is left of it, R, is Ray Train's to start the worker
group: ``fit()`` runs with ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S = R / (CONTROLLER_FAILURE_LIMIT + 1)``
(at least :data:`MIN_ATTEMPT_TIMEOUT_S`), since Train's controller retries a worker group that did
not start up to ``CONTROLLER_FAILURE_LIMIT`` times, each try waiting that long.  Where the user set
``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` and left ``scaling.start_timeout_s`` at 0 on a plan
without an autoscaler, their value stands (it is Ray's own knob).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from alchemetric_ray.config import RunConfig
from alchemetric_ray.errors import GpuPreflightError, StartTimeout, UserError
from alchemetric_ray.placement.capacity import shape
from alchemetric_ray.placement.plan import ResourcePlan, data_bundle, nodes_needed, pack

if TYPE_CHECKING:
    from alchemetric_ray.hardware.device import GpuWorkerReport

PROGRESS_INTERVAL_S = 30.0  # a progress line this often while waiting (tests shorten it)
POLL_INTERVAL_S = 1.0
# The v1 autoscaler keeps ONE standing request per cluster (a GCS key), which Ray Data's autoscaling
# coordinator also overwrites (every 20 s while any dataset runs): our wait asks again this often.
REASK_INTERVAL_S = 10.0
DEFAULT_START_TIMEOUT_S = 120.0  # no autoscaler: the nodes are up, only the worker group starts
AUTOSCALING_START_TIMEOUT_S = 1200.0  # cloud VMs: boot, image pull, setup commands
MIN_ATTEMPT_TIMEOUT_S = 10.0
# How often the Train controller may fail (a worker group that cannot start) before the run fails;
# Ray's default (-1) retries forever.
CONTROLLER_FAILURE_LIMIT = 2
log = logging.getLogger("alchemetric_ray.autoscale")


@dataclass
class StartWindow:
    """The start timeout, and what is left of it for Ray Train once our own wait is over."""

    total_s: float
    started: float
    user_attempt_s: float | None = None  # the user's RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, where it stands

    def remaining(self) -> float:
        return max(0.0, self.total_s - (time.monotonic() - self.started))

    def attempt_timeout_s(self) -> float:
        """Ray Train's per-attempt worker-group start timeout for what is left of the window."""
        if self.user_attempt_s is not None:
            return self.user_attempt_s
        return max(MIN_ATTEMPT_TIMEOUT_S, self.remaining() / (CONTROLLER_FAILURE_LIMIT + 1))

    def apply(self) -> str:
        """Set the per-attempt timeout where ``fit()`` reads it (Train propagates it from the driver's
        environment to its controller) and return it."""
        from alchemetric_ray.placement.session import set_worker_group_start_timeout

        value = f"{self.attempt_timeout_s():g}"
        if self.user_attempt_s is None:  # the user's own value is already there, and stays theirs
            set_worker_group_start_timeout(value)
        return value


def total_start_timeout_s(cfg: RunConfig, autoscaling: bool) -> float:
    """scaling.start_timeout_s, or its default: longer where the autoscaler has to add nodes."""
    return cfg.scaling.start_timeout_s or (AUTOSCALING_START_TIMEOUT_S if autoscaling else DEFAULT_START_TIMEOUT_S)


def start_window(cfg: RunConfig, plan: ResourcePlan) -> StartWindow:
    total = total_start_timeout_s(cfg, plan.autoscale)
    user = None
    if not cfg.scaling.start_timeout_s and not plan.autoscale:
        from alchemetric_ray.placement.session import user_worker_group_start_timeout

        user = user_worker_group_start_timeout()
    return StartWindow(total, time.monotonic(), user)


def run_bundles(plan: ResourcePlan, trials: int = 1, trial_driver: dict[str, float] | None = None) -> list[dict]:
    """What a run asks the autoscaler for: each (concurrent) trial's workers and its driver's share;
    and Ray Data's CPU where the workers' nodes leave none (it would get a node of its own) or the
    node types are unknown.  Where the workers' nodes have room, Ray Data's CPU is not asked for: the
    autoscaler would add another (CPU-only) node for it rather than pack it beside the workers."""
    one = [plan.worker_bundle()] * plan.num_workers + ([trial_driver] if trial_driver else [])
    bundles = one * trials
    if plan.node_type is None or nodes_needed(plan, bundles + [data_bundle()]) > nodes_needed(plan, bundles):
        bundles.append(data_bundle())
    return bundles


@contextlib.contextmanager
def scale_up(cfg: RunConfig, plan: ResourcePlan, bundles: list[dict], *, local_mode: bool = False
             ) -> Iterator[StartWindow]:
    """Ask for ``bundles`` (autoscaling plans), run the GPU preflight (GPU plans), wait within the
    start timeout, and clear the request however the body ends."""
    window = start_window(cfg, plan)
    asked = False
    try:
        if plan.autoscale and not local_mode:
            asked = True  # from here on the finally clears, even if asking itself was interrupted
            _request(bundles)
            print(f"autoscaler: asked for {_counted(bundles)}"
                  + (f" (node type {plan.node_type})" if plan.node_type else "")
                  + f"; waiting up to {_duration(window.total_s)}", flush=True)
        probes = _launch_gpu_probes(plan.num_workers, plan.gpus_per_worker) if plan.use_gpu and not local_mode else []
        if asked or probes:
            _wait(plan, bundles if asked else [], probes, window)
        yield window
    finally:
        if asked:
            _clear()


def _request(bundles: list[dict]) -> None:
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[dict(b) for b in bundles])


def _clear() -> None:
    """Override the standing request with nothing; never masks the error that ended the run."""
    try:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[])
    except Exception as exc:  # Ray already gone (Ctrl-C during shutdown): nothing left to clear
        log.warning("autoscaler: could not clear the resource request (%s)", exc)


# ---- waiting ---------------------------------------------------------------------------------


def gpu_preflight(tasks: int, gpus_each: float, cfg: RunConfig, *, autoscaling: bool) -> None:
    """The GPU preflight alone (``predict``'s GPU actors): ``tasks`` probes of ``gpus_each`` GPUs,
    waited for within scaling.start_timeout_s; the probes' own demand scales a cold cluster up."""
    window = StartWindow(total_start_timeout_s(cfg, autoscaling), time.monotonic())
    _wait(None, [], _launch_gpu_probes(tasks, gpus_each), window)


def _wait(plan: ResourcePlan | None, bundles: list[dict], probes: list, window: StartWindow) -> None:
    import ray

    pending = list(probes)
    started = time.monotonic()
    next_line = started + PROGRESS_INTERVAL_S
    next_ask = started + REASK_INTERVAL_S
    while True:
        up = placed(bundles, _alive_nodes()) if bundles else 0
        if pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
            try:
                for ref in done:
                    _check_probe(_probe_result(ref))
            except UserError:
                for ref in pending:
                    ray.cancel(ref, force=True)
                raise
        if up >= len(bundles) and not pending:
            if bundles:
                print(f"autoscaler: {_counted(bundles)} up after {_duration(time.monotonic() - started)}", flush=True)
            return
        now = time.monotonic()
        if window.remaining() <= 0:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise StartTimeout(_never_came(plan, bundles, up, len(pending), now - started))
        if bundles and now >= next_ask:
            _request(bundles)
            next_ask = now + REASK_INTERVAL_S
        if now >= next_line:
            print(_progress(bundles, up, len(probes) - len(pending), len(probes), now - started), flush=True)
            next_line = now + PROGRESS_INTERVAL_S
        time.sleep(min(POLL_INTERVAL_S, max(0.05, window.remaining())))


def placed(bundles: list[dict], nodes: list[dict[str, float]]) -> int:
    """How many of ``bundles`` fit on ``nodes`` (their total resources)."""
    return len(bundles) - len(pack(bundles, nodes)[0])


def _alive_nodes() -> list[dict[str, float]]:
    import ray

    return [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]


def _progress(bundles: list[dict], up: int, probed: int, probes: int, elapsed: float) -> str:
    parts = []
    if bundles:
        parts.append(f"waiting for {_counted(bundles)}: {up} of {len(bundles)} up")
    if probes:
        parts.append(f"GPU preflight {probed} of {probes} reported")
    return "; ".join(parts) + f", {_duration(elapsed)}"


def _never_came(plan: ResourcePlan | None, bundles: list[dict], up: int, unprobed: int, elapsed: float) -> str:
    missing = pack(bundles, _alive_nodes())[0] if bundles else []
    what = f"{_counted(missing)} never came ({up} of {len(bundles)} bundles up)" if missing else ""
    if unprobed:
        what += ("; " if what else "") + f"{unprobed} GPU preflight task(s) never ran (no node gave them a GPU)"
    where = f" on node type {plan.node_type}" if plan and plan.node_type else ""
    return (f"waited {_duration(elapsed)} (scaling.start_timeout_s) for the workers{where}: {what}; "
            f"see `ray status` and the autoscaler's log (monitor.log), or raise scaling.start_timeout_s")


def _counted(bundles: list[dict]) -> str:
    counts = Counter(shape(b, gpu_first=True) for b in bundles)
    return " + ".join(f"{n} x {shape}" for shape, n in counts.items())


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


# ---- the GPU preflight -----------------------------------------------------------------------


def _gpu_probe() -> GpuWorkerReport:
    """Runs in a task Ray gave GPUs to: which node, which GPUs, and what torch sees there."""
    import ray

    from alchemetric_ray.hardware.device import gpu_worker_report
    from alchemetric_ray.hardware.known_bugs import cuda_worker_bugs

    bugs = cuda_worker_bugs()
    context = ray.get_runtime_context()
    return replace(gpu_worker_report(), backend=bugs.get("backend"), known_bugs=bugs.get("known_bugs", []),
                   node_ip=ray.util.get_node_ip_address(), node_id=context.get_node_id(),
                   gpu_ids=[str(i) for i in ray.get_gpu_ids()])


def _launch_gpu_probes(tasks: int, gpus_each: float) -> list:
    import ray

    probe = ray.remote(num_gpus=gpus_each, num_cpus=0, max_retries=0)(_gpu_probe)
    print(f"GPU preflight: {tasks} task(s) with {gpus_each:g} GPU each check that torch can use the GPUs Ray "
          "hands out", flush=True)
    return [probe.remote() for _ in range(tasks)]


def _probe_result(ref) -> GpuWorkerReport:
    import ray

    try:
        return ray.get(ref)
    except Exception as exc:  # the task itself failed on its node (import error, lost node)
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise GpuPreflightError(f"GPU preflight: the probe task failed on its node ({first[:300]})") from None


def _check_probe(report: GpuWorkerReport) -> None:
    from alchemetric_ray.hardware.device import gpu_worker_problem

    where = f"node {report.node_ip} ({report.node_id[:12]})"
    problem = gpu_worker_problem(report, where)
    if problem:
        raise GpuPreflightError(problem)
    if report.known_bugs:  # the workers check each against the run's own step before training
        print(f"GPU preflight: {where}, {report.backend}: known backend bug(s) that apply there: "
              f"{', '.join(report.known_bugs)} (checked against the run's step on each worker)", flush=True)
