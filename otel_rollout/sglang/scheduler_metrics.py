"""SGLang's own scheduler figures per training step, read from its metrics collectors' files.

SGLang counts what its scheduler does (requests running and queued, KV-pool usage, retractions)
in the scheduler process, where no hook of ours runs, and exports it through its metrics
collectors (``enable_metrics``) as Prometheus multiprocess files: every SGLang process writes
its counters and gauges to ``PROMETHEUS_MULTIPROC_DIR``, which SGLang sets for the engine's
process. That is SGLang's supported way out for these figures, so we read them there, with
``prometheus_client``'s own multiprocess reader, rather than patch the scheduler.

One :class:`SchedulerMetrics` per engine is registered as a poller of
:mod:`otel_rollout.engine_stats`: read when a step opens, once a second and when it ends. Each
read becomes one ``sampled`` :class:`~otel_rollout.engine_stats.EngineSample`: counters as the
change since the previous read (their sum over the step is the delta of SGLang's own counters),
gauges as SGLang last set them (its scheduler sets them at each prefill batch and every
``decode_log_interval`` decode steps, 40 by default).

:func:`totals` and :func:`sample` are the translation, pure and tested without an engine.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Iterable, Iterator, Mapping

from otel_rollout import engine_stats
from otel_rollout.record import FINISH_ABORT

GAUGES = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:token_usage": "kv_cache_usage",
}
COUNTERS = {
    "sglang:prompt_tokens_total": "prompt_tokens",
    "sglang:generation_tokens_total": "generation_tokens",
    "sglang:num_retracted_requests_total": "preemptions",
    "sglang:num_aborted_requests_total": "aborted",
}
Sample = tuple[str, Mapping[str, str], float]
"""One Prometheus sample: name, labels, value."""


def totals(samples: Iterable[Sample], model: str | None) -> dict[str, float]:
    """The figures of one engine (its ``model_name`` label, where a sample has one): counters
    summed, requests summed over data-parallel schedulers, KV usage their maximum. Only the first
    tensor- and pipeline-parallel rank counts: every rank of one scheduler reports the same."""
    out: dict[str, float] = {}
    for name, labels, value in samples:
        key = GAUGES.get(name) or COUNTERS.get(name)
        if key is None or (model is not None and labels.get("model_name", model) != model):
            continue
        if labels.get("tp_rank", "0") != "0" or labels.get("pp_rank", "0") != "0":
            continue
        if key == "kv_cache_usage":
            out[key] = max(out.get(key, 0.0), value)
        else:
            out[key] = out.get(key, 0.0) + value
    return out


def sample(before: Mapping[str, float], now: Mapping[str, float]) -> engine_stats.EngineSample:
    """One read, relative to the previous: what the engine did in between, and its state now."""

    def delta(key: str) -> int:
        return max(0, round(now.get(key, 0.0) - before.get(key, 0.0)))

    return engine_stats.EngineSample(
        running=round(now.get("running", 0.0)),
        waiting=round(now.get("waiting", 0.0)),
        kv_cache_usage=float(now.get("kv_cache_usage", 0.0)),
        prompt_tokens=delta("prompt_tokens"),
        generation_tokens=delta("generation_tokens"),
        preemptions=delta("preemptions"),
        prefix_queries=0,  # per request instead: rollout.step.cache_hit_rate
        prefix_hits=0,
        finished=(FINISH_ABORT,) * delta("aborted"),
        sampled=True,
    )


def read(directory: str) -> Iterator[Sample]:
    """The counters and gauges of every SGLang process, merged as a scrape would merge them.
    Histogram files are skipped: they are most of the bytes and none of the figures."""
    from prometheus_client.multiprocess import MultiProcessCollector

    files = sorted(
        glob.glob(os.path.join(directory, "counter_*.db"))
        + glob.glob(os.path.join(directory, "gauge_*.db"))
    )
    for metric in MultiProcessCollector.merge(files, accumulate=True):  # type: ignore[no-untyped-call]
        for s in metric.samples:
            yield s.name, s.labels, s.value


class SchedulerMetrics:
    """An SGLang engine's poller: each call reads its figures and records the change since the
    previous call; ``False`` once its directory is gone (the engine shut down)."""

    def __init__(self, model: str, served_name: str | None, directory: str) -> None:
        self.model = model
        self.served_name = served_name
        self.directory = directory
        self._last: dict[str, float] | None = None
        self._lock = threading.Lock()  # the poll thread and a step's open / close both read

    def __call__(self) -> bool:
        if not os.path.isdir(self.directory):
            return False
        now = totals(read(self.directory), self.served_name)
        with self._lock:
            before, self._last = self._last, now
            if before is not None:
                engine_stats.record(self.model, sample(before, now))
        return True


def watch(manager: object, model: str) -> None:
    """Register the engine behind ``manager`` (a ``TokenizerManager``) if its metrics are on."""
    args = getattr(manager, "server_args", None)
    enabled = getattr(manager, "enable_metrics", None)
    if enabled is None:
        enabled = getattr(args, "enable_metrics", False)
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not enabled or not directory:
        return
    served = getattr(manager, "served_model_name", None)
    engine_stats.add_poller(
        (directory, served),
        SchedulerMetrics(model, served if isinstance(served, str) else None, directory),
    )
