"""Live progress and the stall watch without an engine: the engine's accounting, the decision,
the log line and the gauges (the real engines' stalls are in tests/vllm and tests/sglang)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from otel_rollout import stalls
from otel_rollout.activity import EngineActivity
from otel_rollout.steps import StepScope, open_steps
from tests.conftest import OTelHarness

S = 1_000_000_000


def test_oldest_in_flight_is_the_straggler_not_the_first_to_finish() -> None:
    activity = EngineActivity()
    first = activity.change(4)  # a batch of four
    time.sleep(0.01)
    second = activity.change(1)
    activity.change(-1, started_ns=second)  # the newer one finishes first
    age = activity.oldest_age_s(first + 2 * S)
    assert age == pytest.approx(2.0, abs=1e-6)
    activity.change(-3, started_ns=first)
    assert activity.oldest_age_s(first + 2 * S) == pytest.approx(2.0, abs=1e-6)  # one left
    activity.change(-1, started_ns=first)
    assert activity.oldest_age_s() == 0.0


def test_an_end_without_its_start_releases_the_oldest() -> None:
    activity = EngineActivity()
    first = activity.change(1)
    time.sleep(0.01)
    second = activity.change(1)
    activity.change(-1)
    assert activity.oldest_age_s(second + S) == pytest.approx(1.0, abs=1e-6)
    activity.change(-1)
    assert activity.oldest_age_s(first + S) == 0.0


def test_silence_counts_only_while_requests_wait_on_generation() -> None:
    activity = EngineActivity()
    assert activity.silence_s(time.monotonic_ns() + 60 * S) == 0.0  # idle: nothing to wait for
    started = activity.change(2)
    assert activity.silence_s(started + 5 * S) == pytest.approx(5.0, abs=1e-3)
    activity.progressed()
    assert activity.silence_s(activity.progress_ns + S) == pytest.approx(1.0, abs=1e-6)
    activity.hold(1)  # a weight sync: no output by design
    assert activity.silence_s(activity.progress_ns + 60 * S) == 0.0
    activity.hold(-1)
    assert activity.silence_s(activity.progress_ns + S) == pytest.approx(1.0, abs=1e-6)
    activity.set_state("paused", True)
    assert activity.silence_s(activity.progress_ns + 60 * S) == 0.0
    activity.set_state("paused", False)
    activity.change(-1, started_ns=started)  # a request finished: a sign of generating too
    assert activity.silence_s(activity.progress_ns + S) == pytest.approx(1.0, abs=1e-6)


def test_the_engines_own_output_stamp_counts_as_progress() -> None:
    activity = EngineActivity()
    started = activity.change(1)
    activity.probe = lambda: time.time()  # the engine received output just now
    assert activity.silence_s() < 0.5
    activity.probe = lambda: None  # the engine keeps no stamp: ours alone
    assert activity.silence_s(started + 3 * S) == pytest.approx(3.0, abs=1e-3)
    activity.probe = lambda: 0.0  # never received anything yet
    assert activity.silence_s(started + 3 * S) == pytest.approx(3.0, abs=1e-3)


def test_check_reports_a_stall_once_and_its_end_once() -> None:
    activity = EngineActivity()
    started = activity.change(3)
    engines = [("vllm", "m", activity)]
    stalled: dict[tuple[str, str], int] = {}
    assert stalls.check(engines, 2.0, stalled, started + 1 * S) == []
    (event,) = stalls.check(engines, 2.0, stalled, started + 3 * S)
    assert (event.resumed, event.in_flight) == (False, 3)
    assert event.silence_s == pytest.approx(3.0, abs=1e-3)
    assert event.oldest_s == pytest.approx(3.0, abs=1e-3)
    assert activity.stalled
    assert stalls.check(engines, 2.0, stalled, started + 4 * S) == []  # still stalled: no repeat
    activity.progressed()
    (resumed,) = stalls.check(engines, 2.0, stalled, activity.progress_ns)
    assert resumed.resumed and not activity.stalled
    assert resumed.silence_s == pytest.approx((activity.progress_ns - started) / S, abs=1e-3)


def test_the_line_names_the_engine_the_wait_and_the_steps_progress() -> None:
    event = stalls.StallEvent("vLLM", "tiny", False, 31.04, 5, 45.2)
    line = stalls.describe(event, [(12, 1019, 1024)], 30.0)
    assert line == (
        "otel_rollout: vLLM engine 'tiny' stalled: no output for 31.0 s with 5 request(s) in "
        "flight, the oldest 45.2 s old; step 12: 1019 of 1024 requests done "
        "(OTEL_ROLLOUT_STALL_TIMEOUT=30)"
    )
    back = stalls.describe(stalls.StallEvent("vLLM", "tiny", True, 52.3, 5, 60.0), [], 30.0)
    assert (
        back
        == "otel_rollout: vLLM engine 'tiny' produces output again after 52.3 s without (5 request(s) in flight)"
    )


def test_step_progress_counts_its_requests_started_and_done(
    otel: OTelHarness, make_telemetry: Any, model: str
) -> None:
    from testkit.records import make_record

    telemetry = make_telemetry()
    with StepScope(7, telemetry=telemetry) as scope:
        assert open_steps()[-1] is scope
        started = telemetry.requests_started(model, "text_completion", 3)
        telemetry.emit(make_record(model))
        assert scope.progress() == (1, 3)
        assert _live(otel) == {"done": 1, "started": 3}
        telemetry.requests_ended(model, "text_completion", 3, started)
    assert scope not in open_steps()
    assert _live(otel) == {"done": 0, "started": 0}


def _live(otel: OTelHarness) -> dict[str, float]:
    """The live-progress gauges (no labels: the open steps of the process together)."""
    data = otel.reader.get_metrics_data()
    found = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name.startswith("rollout.step.open.requests_"):
                    (point,) = metric.data.data_points
                    found[metric.name.rsplit("_", 1)[1]] = point.value
    return found


def test_the_watch_logs_and_gauges_a_stall_within_its_timeout(
    otel: OTelHarness, make_telemetry: Any, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    telemetry = make_telemetry()
    engines = lambda: [(telemetry.provider, m, a) for m, a in telemetry.activities()]  # noqa: E731
    watch = stalls.StallWatch(0.4, engines, lambda: [(3, 0, 2)])
    try:
        with caplog.at_level(logging.INFO, logger="otel_rollout.stalls"):
            began = time.monotonic()
            started = telemetry.requests_started(model, "text_completion", 2)
            while not any("stalled" in r.getMessage() for r in caplog.records):
                assert time.monotonic() - began < 0.4 + 1.0, "no stall line within the timeout"
                time.sleep(0.02)
            assert time.monotonic() - began >= 0.4
            (line,) = [r for r in caplog.records if "stalled" in r.getMessage()]
            assert line.levelno == logging.WARNING
            assert "step 3: 0 of 2 requests done" in line.getMessage()
            assert otel.gauge("rollout.engine.stalled", model) == 1.0
            assert otel.gauge("rollout.engine.silence", model) >= 0.4
            assert otel.gauge("rollout.requests.oldest_age", model) >= 0.4
            telemetry.engine_progressed()
            while not any("again" in r.getMessage() for r in caplog.records):
                assert time.monotonic() - began < 5.0, "no resume line"
                time.sleep(0.02)
            assert otel.gauge("rollout.engine.stalled", model) == 0.0
            telemetry.requests_ended(model, "text_completion", 2, started)
            assert otel.gauge("rollout.engine.silence", model) == 0.0
            assert otel.gauge("rollout.requests.oldest_age", model) == 0.0
    finally:
        watch.stop()


def test_watch_is_one_per_process_and_follows_the_latest_timeout() -> None:
    none: Any = lambda: []  # noqa: E731
    first = stalls.watch(50.0, none, none)
    try:
        assert first is not None
        assert stalls.watch(20.0, none, none) is first and first.timeout_s == 20.0
    finally:
        assert stalls.watch(0, none, none) is None  # 0 stops it
