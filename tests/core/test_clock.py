"""Clock: the single place engine clocks become epoch nanoseconds."""

from __future__ import annotations

import time

from otel_rollout.record import Clock, RequestRecord, normalize_finish_reason

MS = 1_000_000


def test_monotonic_to_epoch_within_a_millisecond() -> None:
    clock = Clock()
    for _ in range(3):
        mono = time.monotonic()
        wall = time.time_ns()
        converted = clock.from_monotonic(mono)
        assert isinstance(converted, int)
        assert abs(converted - wall) < MS
        time.sleep(0.01)


def test_monotonic_past_value_maps_to_the_past() -> None:
    clock = Clock()
    converted = clock.from_monotonic(time.monotonic() - 2.5)
    assert abs((time.time_ns() - converted) - 2_500_000_000) < MS


def test_now_and_wall() -> None:
    clock = Clock()
    assert abs(clock.now_ns() - time.time_ns()) < MS
    # A float epoch second has ~0.2 µs resolution: exact to well under a microsecond.
    assert abs(Clock.from_wall(1_700_000_000.25) - 1_700_000_000_250_000_000) < 1_000
    assert Clock.from_wall(None) is None and clock.from_monotonic(None) is None


def test_relative_timing_is_exact_within_one_clock() -> None:
    clock = Clock()
    a, b = clock.from_monotonic(1000.0), clock.from_monotonic(1000.125)
    assert b - a == 125_000_000


def test_record_derived_durations() -> None:
    r = RequestRecord(provider="p", model="m", operation="o", arrival_ns=1_000, finish_ns=500)
    assert r.duration_s == 0  # clamped, never negative
    assert r.ttft_s is None and r.queue_time_s is None and r.tpot_s is None
    r = RequestRecord(
        provider="p",
        model="m",
        operation="o",
        arrival_ns=0,
        finish_ns=3_000_000_000,
        first_token_ns=1_000_000_000,
        output_tokens=5,
    )
    assert r.tpot_s == 0.5 and r.ttft_s == 1.0 and r.duration_s == 3.0


def test_normalize_finish_reason() -> None:
    assert normalize_finish_reason("eos") == "stop"
    assert normalize_finish_reason({"type": "length", "length": 8}) == "length"
    assert normalize_finish_reason({"type": "abort", "message": "Aborted"}) == "abort"
    assert normalize_finish_reason("weird-new-reason") == "other"
    assert normalize_finish_reason(None) is None and normalize_finish_reason({"x": 1}) is None
