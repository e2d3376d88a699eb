"""The step's causes (``otel_rollout.attribution``), engine-free: timelines written down by hand,
each cause's seconds checked against them, the causes summing to the step exactly.

Real engines with a planted cause: tests/vllm/test_step_causes.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from otel_rollout.attribution import CAUSES, attribute
from otel_rollout.record import RequestRecord, TrajectoryRecord

S = 1_000_000_000_000  # the step's start, ns
MS = 1_000_000


def request(
    arrival: int,
    finish: int,
    tokens: int,
    scheduled: int | None = None,
    first_token: int | None = None,
    **more: Any,
) -> RequestRecord:
    """Times in ms after the step's start."""
    return RequestRecord(
        provider="vllm",
        model="m",
        operation="text_completion",
        arrival_ns=S + arrival * MS,
        finish_ns=S + finish * MS,
        scheduled_ns=None if scheduled is None else S + scheduled * MS,
        first_token_ns=None if first_token is None else S + first_token * MS,
        output_tokens=tokens,
        finish_reasons=more.pop("finish_reasons", ("stop",)),
        **more,
    )


def ms(causes: dict[str, float]) -> dict[str, int]:
    return {c: round(v * 1000) for c, v in causes.items() if round(v * 1000)}


def test_one_long_request_is_length_bound() -> None:
    """Seven requests of 10 tokens end by 120 ms; the eighth decodes 100 tokens until 1,000 ms."""
    records = [request(10, 120, 10, 20, 30) for _ in range(7)]
    records.append(request(10, 1_000, 100, 20, 100, finish_reasons=("length",), max_tokens=100))
    causes = attribute(records, S, S + 1_050 * MS)
    assert causes is not None
    # decode 100 → 1,000 ms (900 ms for 100 tokens): 90 of them beyond the median (10)
    assert ms(causes.seconds) == {
        "framework_gap": 60,  # 0 → 10 ms and 1,000 → 1,050 ms: nothing we saw ran
        "queue": 10,
        "prefill": 80,
        "decode": 90,
        "length_bound": 810,
    }
    assert causes.dominant == "length_bound"
    assert sum(causes.seconds.values()) == pytest.approx(1.05)
    assert causes.share["length_bound"] == pytest.approx(0.810 / 1.05)
    c = causes.critical
    assert (c.output_tokens, c.median_output_tokens, c.finish_reason) == (100, 10, "length")


def test_the_tail_is_read_on_the_same_path() -> None:
    records = [request(0, 100, 10, 0, 10) for _ in range(9)]
    records.append(request(0, 1_000, 100, 0, 100))
    causes = attribute(records, S, S + 1_000 * MS, tail_start_ns=S + 100 * MS)
    assert causes is not None
    # the tail is 100 → 1,000 ms: all decode of the critical request, 90 % past the median
    assert ms(causes.tail) == {"decode": 90, "length_bound": 810}
    assert sum(causes.tail.values()) == pytest.approx(0.9)


def test_a_request_sent_late_is_dispatch_and_a_held_engine_is_held() -> None:
    """The critical request is sent 300 ms after the others; a weight sync holds the engine for
    200 ms of its decode; a reward phase runs after generation; the rest is the framework's."""
    records = [request(0, 100, 10, 0, 10), request(300, 800, 10, 310, 320)]
    phases = [("weight_sync", S + 400 * MS, S + 600 * MS), ("reward", S + 850 * MS, S + 950 * MS)]
    causes = attribute(records, S, S + 1_000 * MS, phases)
    assert causes is not None
    assert ms(causes.seconds) == {
        "dispatch": 300,
        "queue": 10,
        "prefill": 10,
        "decode": 280,  # 320 → 800 ms less the 200 ms held
        "held": 200,
        "phases": 100,
        "framework_gap": 100,  # 800 → 850 and 950 → 1,000 ms
    }
    assert sum(causes.seconds.values()) == pytest.approx(1.0)


def test_phases_before_generation_and_missing_stamps() -> None:
    """A log-prob phase first; requests without scheduled or first-token stamps (a client's
    record over HTTP): their whole time is decode, none of it invented as queue or prefill."""
    records = [request(200, 400, 5), request(200, 600, 5)]
    causes = attribute(records, S, S + 600 * MS, [("log_probs", S, S + 150 * MS)])
    assert causes is not None
    assert ms(causes.seconds) == {"phases": 150, "framework_gap": 50, "decode": 400}


def test_clock_skew_is_clipped_to_the_step() -> None:
    """A remote engine's clock ahead of ours: its times are cut at the step's edges."""
    records = [request(-50, 1_200, 10, -40, -30)]
    causes = attribute(records, S, S + 1_000 * MS)
    assert causes is not None
    assert sum(causes.seconds.values()) == pytest.approx(1.0)
    assert ms(causes.seconds) == {"decode": 1_000}


def test_no_requests_or_no_time_no_causes() -> None:
    assert attribute([], S, S + MS) is None
    assert attribute([request(0, 1, 1)], S, S) is None


def test_every_cause_is_named_once() -> None:
    assert len(set(CAUSES)) == len(CAUSES)


def test_the_time_one_replica_worked_alone_is_replica_imbalance() -> None:
    """Replica a serves 4 requests (done by 100 ms), replica b 12 in three waves of 4 (its last
    wave queued 0 → 200 ms, decoded 200 → 300 ms): from 100 ms on, b worked alone."""
    a = [request(0, 100, 10, 0, 10, replica="a") for _ in range(4)]
    b = [
        request(0, 100 * (1 + i // 4), 10, 100 * (i // 4), 100 * (i // 4) + 10, replica="b")
        for i in range(12)
    ]
    causes = attribute(a + b, S, S + 300 * MS)
    assert causes is not None
    assert ms(causes.seconds) == {"queue": 100, "replica_imbalance": 200}
    assert causes.dominant == "replica_imbalance"
    assert causes.critical.replica == "b"
    # the same work on one replica (no names): queue and decode, no imbalance
    alone = attribute([request(0, 300, 10, 200, 210), request(0, 100, 10, 0, 10)], S, S + 300 * MS)
    assert alone is not None and ms(alone.seconds) == {"queue": 200, "prefill": 10, "decode": 90}


def test_a_long_request_on_the_last_replica_stays_length_bound() -> None:
    """Both replicas end their short requests at 100 ms; b's one long request decodes on to
    1,000 ms: its length, not the balance, is what the step waited on."""
    records = [request(0, 100, 10, 0, 10, replica=r) for r in "aabb"]
    records.append(request(0, 1_000, 100, 0, 100, replica="b"))
    causes = attribute(records, S, S + 1_000 * MS)
    assert causes is not None
    # decode 100 → 1,000 ms: 90 % beyond the median is length_bound; the rest, after a's end, is
    # b working alone
    assert ms(causes.seconds) == {"prefill": 100, "replica_imbalance": 90, "length_bound": 810}
    assert causes.dominant == "length_bound"


def test_the_stretch_an_engine_stayed_paused_is_held() -> None:
    """Paused 200 → 700 ms between the pause and resume calls (``engine_paused``, handed to the
    step by the resume: StepScope.add_held) while the last request was decoding."""
    records = [request(0, 900, 10, 0, 10)]
    phases = [
        ("generation_pause", S + 190 * MS, S + 200 * MS),
        ("engine_paused", S + 200 * MS, S + 700 * MS),
        ("generation_resume", S + 700 * MS, S + 710 * MS),
    ]
    causes = attribute(records, S, S + 900 * MS, phases)
    assert causes is not None
    assert ms(causes.seconds) == {"prefill": 10, "decode": 370, "held": 520}
    assert causes.dominant == "held"


def _trajectory(
    turns: list[tuple[int, int]],
    tools: list[tuple[int, int]],
    scoring: list[tuple[int, int]] = (),  # type: ignore[assignment]
) -> TrajectoryRecord:
    """Intervals in ms after the step's start."""

    def ns(intervals: Any) -> tuple[tuple[int, int], ...]:
        return tuple((S + a * MS, S + b * MS) for a, b in intervals)

    ends = [b for _, b in [*turns, *tools, *scoring]]
    return TrajectoryRecord(
        agent="a",
        start_ns=S + turns[0][0] * MS,
        end_ns=S + max(ends) * MS,
        status="completed",
        turns=ns(turns),
        output_tokens=10,
        tools=ns(tools),
        scoring=ns(scoring),
        generation_s=0.0,
        tool_s=0.0,
        scoring_s=0.0,
        waiting_s=0.0,
    )


def test_a_slow_tool_before_the_last_turn_is_agentic_wait() -> None:
    """Two trajectories: a's turns 0–100 and 150–250 ms around a 50 ms tool; b's first turn
    0–100 ms, a 600 ms tool, its second turn 700–800 ms (the step's last request), then 100 ms
    of scoring. The step waited on b's tool, and on its scoring after generation."""
    records = [
        request(0, 100, 10, 0, 10),
        request(150, 250, 10, 150, 160),
        request(0, 100, 10, 0, 10),
        request(700, 800, 10, 700, 710),
    ]
    trajectories = [
        _trajectory([(0, 100), (150, 250)], [(100, 150)]),
        _trajectory([(0, 100), (700, 800)], [(100, 700)], [(800, 900)]),
    ]
    causes = attribute(records, S, S + 950 * MS, trajectories=trajectories)
    assert causes is not None
    assert ms(causes.seconds) == {
        "dispatch": 100,  # b's first turn
        "agentic_wait": 700,  # b's tool (600) and, after generation, its scoring (100)
        "prefill": 10,
        "decode": 90,
        "framework_gap": 50,
    }
    assert causes.dominant == "agentic_wait"
    # a's tool overlapped b's first turn and tool: it did not delay the last request
    no_trajectories = attribute(records, S, S + 950 * MS)
    assert no_trajectories is not None and no_trajectories.seconds["agentic_wait"] == 0
