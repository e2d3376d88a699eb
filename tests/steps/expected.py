"""Step analytics recomputed from exported request spans, independently of ``steps.analyze``.

The step span's attributes and the ``rollout.step.*`` points must agree with what anyone could
compute from the request spans alone (their start/end timestamps, token counts and finish
reasons); this module is that "anyone", written without looking at the core's sweep.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    start_ns: int
    end_ns: int
    output_tokens: int
    finish_reason: str


@dataclass(frozen=True)
class Expected:
    requests: int
    tail_duration_s: float
    tail_requests: int
    straggler_ratio: float
    latency_p50_s: float
    latency_p90_s: float
    latency_max_s: float
    idle_capacity_s: float
    idle_fraction: float
    peak_active: int
    output_tokens_max: int
    output_tokens_p50: int
    output_tokens_p90: int
    truncation_ratio: float


def nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def expected(requests: Sequence[Request], tail_quantile: float = 0.9) -> Expected:
    n = len(requests)
    finishes = sorted(r.end_ns for r in requests)
    tail_start = finishes[math.ceil(tail_quantile * n) - 1]
    latencies = [(r.end_ns - r.start_ns) / 1e9 for r in requests]
    median = nearest_rank(latencies, 0.5)

    # In-flight count on every elementary interval between consecutive distinct timestamps,
    # counted directly (no event sweep): a request is in flight on [start, end).
    stamps = sorted({r.start_ns for r in requests} | {r.end_ns for r in requests})
    intervals = []
    for left, right in zip(stamps, stamps[1:], strict=False):
        active = sum(1 for r in requests if r.start_ns <= left < r.end_ns)
        intervals.append((right - left, active))
    peak = max(active for _, active in intervals)
    window = stamps[-1] - stamps[0]
    idle = sum(length * (peak - active) for length, active in intervals)
    tokens = [r.output_tokens for r in requests]
    return Expected(
        requests=n,
        tail_duration_s=(finishes[-1] - tail_start) / 1e9,
        tail_requests=sum(1 for f in finishes if f > tail_start),
        straggler_ratio=max(latencies) / median,
        latency_p50_s=median,
        latency_p90_s=nearest_rank(latencies, 0.9),
        latency_max_s=max(latencies),
        idle_capacity_s=idle / 1e9,
        idle_fraction=idle / (peak * window),
        peak_active=peak,
        output_tokens_max=max(tokens),
        output_tokens_p50=int(nearest_rank(tokens, 0.5)),
        output_tokens_p90=int(nearest_rank(tokens, 0.9)),
        truncation_ratio=sum(1 for r in requests if r.finish_reason == "length") / n,
    )
