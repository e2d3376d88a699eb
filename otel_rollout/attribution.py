"""Why a step took as long as it did: its wall time split into named causes (issue #42).

A step waits for its last request, so the step's time is read along its *critical path*: the
request that finished last (the one that ended generation), and whatever the step did before
generation began and after it ended. That path is cut into consecutive segments, each named by
its cause, so the causes sum to the step's duration exactly:

* before the first request arrived and after the last one finished: ``held`` (the engine was
  held: a weight sync, sleep or pause — an engine operation or a framework's weight-sync
  phase), ``phases`` (another phase of the step ran: reward, log-probs, …), ``framework_gap``
  (nothing we saw ran: the framework's own work between phases);
* from the first request's arrival to the critical request's: ``dispatch`` (it entered the
  engine late: sent late by the client, a network or router hop, an agentic loop's earlier
  turns);
* the critical request itself: ``queue`` (arrival to scheduled), ``prefill`` (scheduled to
  first token), then its decode, split in two: ``length_bound`` — the share of its decode spent
  on output tokens beyond the step's median length (``(tokens − median) / tokens`` of the
  decode, at the request's own pace), the time a cap at the median would have saved — and
  ``decode`` (the rest: generation at the median length);
* where the step's requests name two replicas or more (:mod:`otel_rollout.replicas`): the
  critical request's time after every *other* replica had finished its last request of the step
  is ``replica_imbalance`` — the step waited on one replica while all the others stood idle
  (its length beyond the median stays ``length_bound``: a long request is not the balance's
  fault). What balancing would have saved is the what-if's estimate
  (:mod:`otel_rollout.replica_load`);
* in an agentic step (:mod:`otel_rollout.trajectories`): the part of the critical request's
  ``dispatch`` its own trajectory spent in tool calls or scoring is ``agentic_wait`` (the rest
  stays ``dispatch``: its earlier turns), and so is time outside generation that no phase
  covers but some trajectory's tool call or scoring did;
* wherever the engine was held while the critical request was in flight, that time is
  ``held`` instead.

The tail (from ``OTEL_ROLLOUT_TAIL_QUANTILE`` of finishes to the last) is read on the same
segments. Times the engine did not stamp fall to the neighbouring segment (no scheduled stamp:
the queue is counted as prefill; no first token: all of it is decode). Not yet separated (they
are inside ``decode`` / ``queue``): preemption recompute and a full KV cache at admission —
the critical request's own preemption count and finish reason are kept beside the causes.

Pure: records and intervals in, figures out; no SDK, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from otel_rollout.quantiles import nearest_rank
from otel_rollout.record import RequestRecord, TrajectoryRecord
from otel_rollout.replica_load import replica_ends

__all__ = ["CAUSES", "HELD_PHASES", "CriticalRequest", "StepCauses", "attribute"]

CAUSES = (
    "length_bound",
    "replica_imbalance",
    "decode",
    "prefill",
    "queue",
    "dispatch",
    "agentic_wait",
    "held",
    "phases",
    "framework_gap",
)
"""Every cause, bounded (a metric label): the order is the order they are reported in."""

HELD_PHASES = frozenset(
    {
        "weight_sync",
        "engine_sleep",
        "engine_wake",
        "generation_pause",
        "generation_resume",
        "engine_paused",
        "engine_asleep",
    }
)
"""Phases during which the engine was held (:mod:`otel_rollout.engine_ops`' operations and the
frameworks' weight-sync timers), and the stretches it stayed paused or asleep between them
(``engine_<state>``, :meth:`~otel_rollout.steps.StepScope.add_held`): no request of the step
could make progress."""


@dataclass(frozen=True)
class CriticalRequest:
    """The request that finished last: what the step waited on."""

    duration_s: float
    output_tokens: int | None
    median_output_tokens: int
    finish_reason: str | None
    preemptions: int | None
    trace_id: str
    span_id: str
    replica: str | None = None


Segment = tuple[int, int, str]


@dataclass(frozen=True)
class StepCauses:
    """A step's seconds by cause (summing to its duration) and its tail's (summing to the tail)."""

    seconds: dict[str, float]
    tail: dict[str, float]
    dominant: str
    critical: CriticalRequest
    share: dict[str, float] = field(default_factory=dict)
    """Each cause's seconds / the step's duration."""
    path: tuple[Segment, ...] = ()
    """The step's time in order, ``(start_ns, end_ns, cause)``, neighbours of one cause joined:
    what the step picture's cause band draws."""


def attribute(
    records: Sequence[RequestRecord],
    start_ns: int,
    end_ns: int,
    phases: Sequence[tuple[str, int, int]] = (),
    tail_start_ns: int | None = None,
    trajectories: Sequence[TrajectoryRecord] = (),
) -> StepCauses | None:
    """The causes of the step ``[start_ns, end_ns]`` from its requests, top-level phases
    (``(name, start_ns, end_ns)``) and agentic trajectories; ``None`` without a request or a
    positive duration."""
    if not records or end_ns <= start_ns:
        return None
    critical = max(records, key=lambda r: (r.finish_ns, r.finish_ns - r.arrival_ns))
    first_arrival = min(r.arrival_ns for r in records)
    tokens = sorted(r.output_tokens or 0 for r in records)
    median_tokens = int(nearest_rank(tokens, 0.5))

    def clip(t: int) -> int:
        return min(max(t, start_ns), end_ns)

    g0, gend = clip(first_arrival), clip(critical.finish_ns)
    arrival = clip(max(critical.arrival_ns, first_arrival))
    scheduled = clip(critical.scheduled_ns) if critical.scheduled_ns is not None else arrival
    first_token = clip(critical.first_token_ns) if critical.first_token_ns is not None else None
    decode_from = first_token if first_token is not None else scheduled
    # monotone, inside the generation window
    arrival = min(max(arrival, g0), gend)
    scheduled = min(max(scheduled, arrival), gend)
    decode_from = min(max(decode_from, scheduled), gend)
    length_ns = 0
    out = critical.output_tokens
    if out and out > median_tokens:
        length_ns = int((gend - decode_from) * (out - median_tokens) / out)
    path: list[Segment] = [
        (g0, arrival, "dispatch"),
        (arrival, scheduled, "queue"),
        (scheduled, decode_from, "prefill"),
        (decode_from, gend - length_ns, "decode"),
        (gend - length_ns, gend, "length_bound"),
    ]
    own = _trajectory_of(critical, trajectories)
    if own is not None:  # its trajectory's tool calls and scoring before it was sent
        path = _cover(path, _merge([*own.tools, *own.scoring]), {"dispatch"}, "agentic_wait")
    others = replica_ends(records)
    others.pop(critical.replica or "", None)
    if critical.replica is not None and others:
        alone = [(clip(max(others.values())), gend)]  # every other replica had finished
        path = _cover(path, alone, _WAITING, "replica_imbalance")
    held = _merge([(s, e) for name, s, e in phases if name in HELD_PHASES])
    other = _merge([(s, e) for name, s, e in phases if name not in HELD_PHASES])
    segments = _outside(start_ns, g0, held, other) + _cover(path, held, None, "held")
    segments += _outside(gend, end_ns, held, other)
    # outside generation, what no phase covers but some trajectory's tool call or scoring did
    waits = _merge([i for t in trajectories for i in (*t.tools, *t.scoring)])
    segments = _cover(segments, waits, {"framework_gap"}, "agentic_wait")

    seconds = {c: 0.0 for c in CAUSES}
    tail = {c: 0.0 for c in CAUSES}
    tail_from = gend if tail_start_ns is None else clip(tail_start_ns)
    for s, e, cause in segments:
        if e > s:
            seconds[cause] += (e - s) / 1e9
            lo, hi = max(s, tail_from), min(e, gend)
            if hi > lo:
                tail[cause] += (hi - lo) / 1e9
    duration = (end_ns - start_ns) / 1e9
    return StepCauses(
        seconds=seconds,
        tail=tail,
        dominant=max(CAUSES, key=lambda c: seconds[c]),
        critical=CriticalRequest(
            critical.duration_s,
            critical.output_tokens,
            median_tokens,
            critical.finish_reason,
            critical.preemptions,
            critical.trace_hex or "",
            critical.span_hex or "",
            critical.replica,
        ),
        share={c: v / duration for c, v in seconds.items()},
        path=_joined(segments),
    )


_WAITING = frozenset({"dispatch", "queue", "prefill", "decode"})
"""The critical path's segments that are time spent on its replica's work, not on its own length."""


def _joined(segments: list[Segment]) -> tuple[Segment, ...]:
    """Non-empty segments in order, a cause's neighbours joined into one."""
    out: list[Segment] = []
    for s, e, cause in sorted((seg for seg in segments if seg[1] > seg[0]), key=lambda g: g[0]):
        if out and out[-1][2] == cause and out[-1][1] >= s:
            out[-1] = (out[-1][0], max(out[-1][1], e), cause)
        else:
            out.append((s, e, cause))
    return tuple(out)


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping intervals as one, in order."""
    merged: list[tuple[int, int]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def _cut(start: int, end: int, cover: list[tuple[int, int]]) -> list[tuple[int, int, bool]]:
    """``[start, end)`` in pieces, each inside ``cover`` (True) or outside it (False)."""
    pieces: list[tuple[int, int, bool]] = []
    at = start
    for s, e in cover:
        if e <= at or s >= end:
            continue
        if s > at:
            pieces.append((at, s, False))
        pieces.append((max(s, at), min(e, end), True))
        at = min(e, end)
    if at < end:
        pieces.append((at, end, False))
    return pieces


def _cover(
    segments: list[Segment],
    cover: list[tuple[int, int]],
    causes: AbstractSet[str] | None,
    to: str,
) -> list[Segment]:
    """``segments`` with their parts inside ``cover`` named ``to`` — only segments named in
    ``causes`` (all where ``None``)."""
    return [
        (s, e, to if inside else cause)
        for start, end, cause in segments
        for s, e, inside in (
            _cut(start, end, cover) if causes is None or cause in causes else [(start, end, False)]
        )
    ]


def _trajectory_of(
    critical: RequestRecord, trajectories: Sequence[TrajectoryRecord]
) -> TrajectoryRecord | None:
    """The trajectory whose turn overlaps the critical request most: the one it was a turn of."""
    best, most = None, 0
    for t in trajectories:
        for s, e in t.turns:
            overlap = min(e, critical.finish_ns) - max(s, critical.arrival_ns)
            if overlap > most:
                best, most = t, overlap
    return best


def _outside(
    start: int, end: int, held: list[tuple[int, int]], other: list[tuple[int, int]]
) -> list[Segment]:
    """Step time outside generation: held, another phase, or nothing we saw."""
    out: list[Segment] = []
    for s, e, is_held in _cut(start, end, held):
        if is_held:
            out.append((s, e, "held"))
        else:
            out += [(a, b, "phases" if p else "framework_gap") for a, b, p in _cut(s, e, other)]
    return out
