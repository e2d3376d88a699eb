"""Inside the engine, per step: pure functions over a step's request records and the engine's
own per-iteration windows (:mod:`otel_rollout.engine_stats`) — the request phases (queue,
prefill, decode), prefix-cache hits and the engine's figures (KV cache, queue depth, tokens,
preemptions, speculative decoding). Kept apart from :mod:`otel_rollout.analysis` (the step's tail)
because these figures come from the engine's own objects and grow with each engine feature.

No OpenTelemetry, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from otel_rollout.engine_stats import EngineWindow
from otel_rollout.quantiles import nearest_rank
from otel_rollout.record import FINISH_ABORT, RequestRecord


@dataclass(frozen=True)
class PhaseStats:
    """Nearest-rank p50 / p90 / max of one request phase over the requests that have it."""

    requests: int
    p50_s: float
    p90_s: float
    max_s: float


@dataclass(frozen=True)
class RequestPhases:
    """Where the step's requests spent their time: queue (arrival → scheduled), prefill
    (scheduled → first token), decode (first token → finish). A phase is ``None`` when no request
    of the step has both its ends stamped by the engine (``rollout.timing.source`` says why)."""

    queue: PhaseStats | None
    prefill: PhaseStats | None
    decode: PhaseStats | None


@dataclass(frozen=True)
class CacheStats:
    """Prefix-cache hits of the step: prompt tokens the engine found cached, as it counted them
    per request (vLLM's ``num_cached_tokens``, SGLang's ``cached_tokens``)."""

    requests: int
    """Requests whose engine reported cached tokens (the others are not in the figures)."""
    prompt_tokens: int
    cached_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _phase(values: Sequence[float | None]) -> PhaseStats | None:
    known = sorted(v for v in values if v is not None)
    if not known:
        return None
    return PhaseStats(len(known), nearest_rank(known, 0.5), nearest_rank(known, 0.9), known[-1])


def analyze_request_phases(records: Sequence[RequestRecord]) -> RequestPhases | None:
    phases = RequestPhases(
        _phase([r.queue_time_s for r in records]),
        _phase([r.prefill_time_s for r in records]),
        _phase([r.decode_time_s for r in records]),
    )
    return None if phases == RequestPhases(None, None, None) else phases


def analyze_cache(records: Sequence[RequestRecord]) -> CacheStats | None:
    reported = [r for r in records if r.cached_tokens is not None and r.prompt_tokens]
    if not reported:
        return None
    return CacheStats(
        len(reported),
        sum(r.prompt_tokens or 0 for r in reported),
        sum(r.cached_tokens or 0 for r in reported),
    )


@dataclass(frozen=True)
class EngineStepStats:
    """The engine's own figures over the step (:mod:`otel_rollout.engine_stats`): what its
    scheduler counted per iteration while the step was open, summed over the process's engines."""

    iterations: int
    running_peak: int
    waiting_peak: int
    """Queue depth: the most requests waiting to be scheduled after any iteration."""
    kv_cache_usage_peak: float
    kv_cache_usage_mean: float
    prompt_tokens: int
    generation_tokens: int
    generation_throughput: float
    """Generated tokens per second of the step."""
    preemptions: int
    prefix_cache_hit_rate: float | None
    aborted: int
    spec_draft_tokens: int | None = None
    """Speculative decoding: draft tokens proposed over the step; ``None`` where none was."""
    spec_accepted_tokens: int | None = None
    spec_acceptance_rate: float | None = None
    source: str = "iterations"
    """``iterations``: every engine iteration (vLLM's stat loggers); ``sampled``: the engine's
    own metrics read when the step opened, each second and when it ended (SGLang's scheduler):
    counts exact over the step, gauges' peak and mean over those reads, ``iterations`` the reads."""


def analyze_engine(windows: Sequence[EngineWindow], duration_s: float) -> EngineStepStats | None:
    if not windows:
        return None
    w = windows[0]
    for other in windows[1:]:
        w = w.merge(other)
    if w.iterations == 0:
        return None
    return EngineStepStats(
        iterations=w.iterations,
        running_peak=w.running_peak,
        waiting_peak=w.waiting_peak,
        kv_cache_usage_peak=w.kv_cache_usage_peak,
        kv_cache_usage_mean=w.kv_cache_usage_mean,
        prompt_tokens=w.prompt_tokens,
        generation_tokens=w.generation_tokens,
        generation_throughput=w.generation_tokens / duration_s if duration_s > 0 else 0.0,
        preemptions=w.preemptions,
        prefix_cache_hit_rate=w.prefix_cache_hit_rate,
        aborted=w.finished.get(FINISH_ABORT, 0),
        spec_draft_tokens=w.spec_draft_tokens or None,
        spec_accepted_tokens=w.spec_accepted_tokens if w.spec_draft_tokens else None,
        spec_acceptance_rate=(
            w.spec_accepted_tokens / w.spec_draft_tokens if w.spec_draft_tokens else None
        ),
        source="sampled" if w.sampled else "iterations",
    )
