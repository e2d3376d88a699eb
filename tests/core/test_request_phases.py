"""Queue / prefill / decode and the prefix cache over a step's records (#12), engine-free:
the pure analysis, the step span's figures and the terminal lines."""

from __future__ import annotations

import pytest

from otel_rollout.analysis import analyze
from otel_rollout.attributes import step_span_attributes
from otel_rollout.reports.summary import format_summary
from testkit.records import make_record

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def _records() -> list:
    # (queue, prefill, decode) in ms; the last has no engine stamps (observed timing)
    phases = [(1, 10, 100), (2, 20, 200), (50, 30, 3000), (3, 10, 300)]
    records = []
    for i, (queue, prefill, decode) in enumerate(phases):
        arrival = T0 + i * MS
        records.append(
            make_record(
                "m",
                arrival_ns=arrival,
                scheduled_ns=arrival + queue * MS,
                first_token_ns=arrival + (queue + prefill) * MS,
                finish_ns=arrival + (queue + prefill + decode) * MS,
                prompt_tokens=100,
                cached_tokens=[0, 64, 64, 96][i],
                preemptions=2 if i == 2 else 0,
            )
        )
    records.append(
        make_record(
            "m",
            arrival_ns=T0,
            finish_ns=T0 + 50 * MS,
            scheduled_ns=None,
            first_token_ns=None,
            cached_tokens=None,
            timing_source="observed",
        )
    )
    return records


def test_phases_and_cache_over_the_records_that_have_them() -> None:
    stats = analyze(_records(), duration_s=4.0)
    assert stats is not None and stats.request_phases is not None and stats.cache is not None
    queue, prefill, decode = (
        stats.request_phases.queue,
        stats.request_phases.prefill,
        stats.request_phases.decode,
    )
    assert queue is not None and prefill is not None and decode is not None
    assert queue.requests == prefill.requests == decode.requests == 4  # the observed one has none
    assert (queue.p50_s, queue.p90_s, queue.max_s) == pytest.approx((0.002, 0.05, 0.05))
    assert (prefill.p50_s, prefill.max_s) == pytest.approx((0.01, 0.03))
    assert (decode.p50_s, decode.p90_s, decode.max_s) == pytest.approx((0.2, 3.0, 3.0))
    assert (stats.cache.requests, stats.cache.prompt_tokens, stats.cache.cached_tokens) == (
        4,
        400,
        224,
    )
    assert stats.cache.hit_rate == pytest.approx(0.56)


def test_a_step_without_engine_stamps_has_neither() -> None:
    observed = [r for r in _records() if r.timing_source == "observed"]
    stats = analyze(observed, duration_s=1.0)
    assert stats is not None and stats.request_phases is None and stats.cache is None
    attrs = step_span_attributes(stats)
    assert not any(k.startswith("rollout.step.queue_time") for k in attrs)
    assert "rollout.step.cache_hit_rate" not in attrs


def test_step_span_figures_and_terminal_lines() -> None:
    stats = analyze(_records(), duration_s=4.0)
    assert stats is not None
    attrs = step_span_attributes(stats)
    assert attrs["rollout.step.queue_time.p90_s"] == pytest.approx(0.05)
    assert attrs["rollout.step.decode_time.max_s"] == pytest.approx(3.0)
    assert attrs["rollout.step.prefill_time.p90_s"] == pytest.approx(0.03)
    assert attrs["rollout.step.cache_hit_rate"] == pytest.approx(0.56)
    assert attrs["rollout.step.cached_tokens"] == 224
    text = format_summary(3, stats)
    assert (
        "  request phases: queue p50 0.002 p90 0.050 max 0.050 s | "
        "prefill p50 0.010 p90 0.030 max 0.030 s | decode p50 0.200 p90 3.000 max 3.000 s"
    ) in text
    assert "  prefix cache: 56.0% of 400 prompt tokens cached (224 tokens, 4 requests)" in text
    slowest = next(line for line in text.splitlines() if line.startswith("  slow:"))
    assert "| queue 0.050 prefill 0.030 decode 3.000 s | preempted 2x |" in slowest
