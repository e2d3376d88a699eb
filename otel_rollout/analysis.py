"""Step analysis: pure functions over a step's request records, nothing else.

No OpenTelemetry, no I/O: the same function turns the records of one process, of several Ray
actors or of a step log read back from disk into the same :class:`StepStats`, and a test can
recompute every figure independently from exported spans.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from otel_rollout.record import FINISH_LENGTH, RequestRecord, TrajectoryRecord


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: a value that really occurred, so it can be traced to a request."""
    index = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[index]


@dataclass(frozen=True)
class Straggler:
    duration_s: float
    output_tokens: int | None
    finish_reason: str | None
    trace_id: str
    span_id: str


@dataclass(frozen=True)
class SlowTrajectory:
    duration_s: float
    turns: int
    tool_s: float
    status: str
    trace_id: str
    span_id: str


@dataclass(frozen=True)
class TrajectoryStats:
    """What a step's trajectories say: how long and how many turns, and where their time went."""

    count: int
    turns_p50: int
    turns_max: int
    duration_p50_s: float
    duration_p90_s: float
    duration_max_s: float
    tool_share: float
    """Σ tool seconds over Σ trajectory seconds: the share of agent time spent waiting on tools."""
    generation_share: float
    scoring_share: float
    statuses: dict[str, int]
    slowest: tuple[SlowTrajectory, ...] = ()

    @property
    def slowest_span_ids(self) -> list[str]:
        return [t.span_id for t in self.slowest if t.span_id]


def analyze_trajectories(
    trajectories: Sequence[TrajectoryRecord], slowest: int = 5
) -> TrajectoryStats | None:
    """A step's trajectory figures; ``None`` for a step without trajectories.

    Shares are of the trajectories' summed wall time, so one long conversation weighs by its
    length: "tools took 40 % of agent time", not "of the average trajectory".
    """
    if not trajectories:
        return None
    durations = sorted(t.duration_s for t in trajectories)
    turns = sorted(len(t.turns) for t in trajectories)
    total = sum(durations)

    def share(seconds: float) -> float:
        return seconds / total if total > 0 else 0.0

    statuses: dict[str, int] = {}
    for t in trajectories:
        statuses[t.status] = statuses.get(t.status, 0) + 1
    ranked = sorted(trajectories, key=lambda t: t.duration_s, reverse=True)[:slowest]
    return TrajectoryStats(
        count=len(trajectories),
        turns_p50=int(nearest_rank(turns, 0.5)),
        turns_max=turns[-1],
        duration_p50_s=nearest_rank(durations, 0.5),
        duration_p90_s=nearest_rank(durations, 0.9),
        duration_max_s=durations[-1],
        tool_share=share(sum(t.tool_s for t in trajectories)),
        generation_share=share(sum(t.generation_s for t in trajectories)),
        scoring_share=share(sum(t.scoring_s for t in trajectories)),
        statuses=dict(sorted(statuses.items())),
        slowest=tuple(
            SlowTrajectory(
                t.duration_s, len(t.turns), t.tool_s, t.status, t.trace_hex or "", t.span_hex or ""
            )
            for t in ranked
        ),
    )


@dataclass(frozen=True)
class StepStats:
    """What a step's requests say about its tail; every value is derived from their timelines."""

    requests: int
    duration_s: float
    window_s: float
    tail_quantile: float
    tail_start_ns: int
    tail_duration_s: float
    tail_requests: int
    latency_p50_s: float
    latency_p90_s: float
    latency_max_s: float
    straggler_ratio: float
    output_tokens_p50: int
    output_tokens_p90: int
    output_tokens_max: int
    truncation_ratio: float
    peak_active: int
    idle_capacity_s: float
    idle_fraction: float
    stragglers: tuple[Straggler, ...] = field(default=())
    trajectories: TrajectoryStats | None = None
    """The step's agentic trajectories, when it had any (:func:`analyze_trajectories`)."""

    @property
    def tail_fraction(self) -> float:
        return self.tail_duration_s / self.duration_s if self.duration_s > 0 else 0.0


def analyze(
    records: Sequence[RequestRecord],
    duration_s: float,
    tail_quantile: float = 0.9,
    stragglers: int = 5,
    trajectories: Sequence[TrajectoryRecord] = (),
) -> StepStats | None:
    """Compute a step's tail analytics from its requests; ``None`` for a step without requests.

    The tail starts at the finish of the request that brought the finished share to
    ``tail_quantile``; the requests finishing after it are the stragglers the step waited on.
    Idle capacity integrates (peak in-flight − in-flight) over the rollout window, first arrival
    to last finish: the request-slots the engine had proven it could hold but that sat empty.
    """
    if not records:
        return None
    n = len(records)
    finishes = sorted(r.finish_ns for r in records)
    tail_start = finishes[max(0, math.ceil(tail_quantile * n) - 1)]
    last = finishes[-1]
    latencies = sorted(r.duration_s for r in records)
    tokens = sorted(r.output_tokens or 0 for r in records)
    median = nearest_rank(latencies, 0.5)

    # Sweep the arrival/finish events once: in-flight count as a step function of time.
    events = sorted(
        [(r.arrival_ns, 1) for r in records] + [(r.finish_ns, -1) for r in records],
        key=lambda e: (e[0], e[1]),
    )
    first = events[0][0]
    active = peak = 0
    segments: list[tuple[int, int]] = []  # (length ns, in-flight during it)
    prev = first
    for ts, delta in events:
        if ts > prev:
            segments.append((ts - prev, active))
            prev = ts
        active += delta
        peak = max(peak, active)
    window_ns = last - first
    idle_ns = sum(length * (peak - level) for length, level in segments)
    idle_fraction = idle_ns / (peak * window_ns) if peak and window_ns > 0 else 0.0

    slowest = sorted(records, key=lambda r: r.duration_s, reverse=True)[:stragglers]
    return StepStats(
        requests=n,
        duration_s=duration_s,
        window_s=window_ns / 1e9,
        tail_quantile=tail_quantile,
        tail_start_ns=tail_start,
        tail_duration_s=(last - tail_start) / 1e9,
        tail_requests=sum(1 for f in finishes if f > tail_start),
        latency_p50_s=median,
        latency_p90_s=nearest_rank(latencies, 0.9),
        latency_max_s=latencies[-1],
        straggler_ratio=latencies[-1] / median if median > 0 else 1.0,
        output_tokens_p50=int(nearest_rank(tokens, 0.5)),
        output_tokens_p90=int(nearest_rank(tokens, 0.9)),
        output_tokens_max=int(tokens[-1]),
        truncation_ratio=sum(1 for r in records if r.finish_reason == FINISH_LENGTH) / n,
        peak_active=peak,
        idle_capacity_s=idle_ns / 1e9,
        idle_fraction=idle_fraction,
        stragglers=tuple(
            Straggler(
                r.duration_s, r.output_tokens, r.finish_reason, r.trace_hex or "", r.span_hex or ""
            )
            for r in slowest
        ),
        trajectories=analyze_trajectories(trajectories, stragglers),
    )
