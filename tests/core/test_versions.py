"""Weight versions without an engine: counting updates, bursts, named versions, the lookup by
arrival time, the request span attribute and the step's staleness (issue #13 item 3)."""

from __future__ import annotations

import time

import pytest

from otel_rollout import rollout_step, set_weight_version
from otel_rollout.analysis import analyze, analyze_staleness
from otel_rollout.reports.steplog import step_entry
from otel_rollout.reports.summary import format_summary
from otel_rollout.telemetry import register, unregister
from otel_rollout.versions import HISTORY, WeightVersions, as_int
from testkit.records import make_record
from tests.conftest import OTelHarness, flush_emitters


def test_updates_count_and_a_burst_is_one_update() -> None:
    versions = WeightVersions()
    assert not versions.seen and versions.at(5) is None
    versions.updated(100)  # first update: bucket 1 …
    versions.updated(110)  # … bucket 2, no request started between: the same update
    versions.generation_started()
    versions.updated(200)
    assert versions.current == 2
    assert [versions.at(t) for t in (50, 100, 105, 110, 150, 199, 200, 10**9)] == [
        0,
        0,  # the burst ended at 110: a request arriving during it ran the old weights
        0,
        1,
        1,
        1,
        2,
        2,
    ]


def test_a_named_version_wins_and_stops_counting() -> None:
    versions = WeightVersions()
    versions.updated(100, version="7")
    versions.generation_started()
    versions.updated(200)  # no name: the trainer numbers versions now, nothing counted
    versions.name(300, 9)
    assert versions.current == 9
    assert [versions.at(t) for t in (99, 100, 250, 300)] == [0, 7, 7, 9]
    versions.name(400, "policy-b")
    assert versions.at(500) == "policy-b" and as_int("policy-b") is None


def test_history_is_bounded() -> None:
    versions = WeightVersions()
    for i in range(HISTORY + 10):
        versions.generation_started()
        versions.updated(1000 + i)
    assert versions.current == HISTORY + 10
    assert versions.at(0) == 11  # older than every change kept: the oldest known, not 0
    assert versions.at(1000 + HISTORY + 9) == HISTORY + 10


def test_staleness_against_the_step_version() -> None:
    records = [make_record("m", weight_version=v) for v in (3, 3, 4, 5, None, "x")]
    stats = analyze_staleness(records, current=None, newest=[6])
    assert stats is not None
    assert (stats.current, stats.max, stats.stale_requests, stats.requests) == (6, 3, 4, 4)
    assert stats.mean == pytest.approx((3 + 3 + 2 + 1) / 4)
    named = analyze_staleness(records, current=5)
    assert named is not None and (named.current, named.max, named.stale_requests) == (5, 2, 3)
    assert analyze_staleness([make_record("m")]) is None


def test_requests_carry_the_version_of_their_arrival(
    otel: OTelHarness, make_telemetry: object, model: str
) -> None:
    telemetry = make_telemetry()  # type: ignore[operator]
    activity = telemetry.engine_activity(model)
    before = make_record(model, request_id="before")
    activity.change(1)
    register(telemetry)  # an instrumented engine of this process
    try:
        set_weight_version(4, model=model)
    finally:
        unregister(telemetry)
    after = make_record(model, request_id="after")
    after.arrival_ns = before.arrival_ns + 10_000_000_000  # arrived after the version was named
    after.finish_ns = after.arrival_ns + 1
    with rollout_step(12) as step:
        telemetry.emit(before)
        telemetry.emit(after)
    activity.change(-1)
    flush_emitters()
    spans = {
        s.attributes["gen_ai.response.id"]: s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.response.id") in ("before", "after")
    }
    assert spans["before"].attributes["rollout.weight.version"] == 0
    assert spans["after"].attributes["rollout.weight.version"] == 4
    assert step.stats is not None and step.stats.staleness is not None
    assert (step.stats.staleness.current, step.stats.staleness.max) == (4, 4)
    (step_span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert step_span.attributes["rollout.step.staleness.max"] == 4
    assert step_span.attributes["rollout.step.stale_requests"] == 1


def test_a_request_of_an_engine_without_versions_has_none(
    otel: OTelHarness, make_telemetry: object, model: str
) -> None:
    telemetry = make_telemetry()  # type: ignore[operator]
    telemetry.emit(make_record(model, request_id="plain"))
    flush_emitters()
    (span,) = [
        s for s in otel.finished_spans() if s.attributes.get("gen_ai.response.id") == "plain"
    ]
    assert "rollout.weight.version" not in span.attributes


def test_summary_and_step_log_show_the_versions() -> None:
    records = [make_record("m", weight_version=v, request_id=f"r{v}") for v in (1, 2)]
    stats = analyze(records, 1.0, weight_version=2)
    assert stats is not None
    text = format_summary(3, stats)
    assert (
        "  weights: version 2 | staleness max 1 mean 0.50 | 1 of 2 requests from older weights"
        in text.splitlines()
    )
    entry = step_entry(3, stats, records)
    assert {r["request_id"]: r["weight_version"] for r in entry["requests"]} == {"r1": 1, "r2": 2}
    assert entry["stats"]["staleness"]["max"] == 1


def test_a_sync_at_the_end_of_the_step_leaves_its_samples_on_policy(
    otel: OTelHarness, make_telemetry: object, model: str
) -> None:
    """A synchronous loop: generate with version 3, then load version 4 for the next step before
    the step ends. The step's samples were generated by the weights it trains: staleness 0."""
    telemetry = make_telemetry()  # type: ignore[operator]
    activity = telemetry.engine_activity(model)
    activity.weights.name(time.time_ns() - 60 * 10**9, 3)
    register(telemetry)
    try:
        with rollout_step(13) as step:
            telemetry.emit(make_record(model))  # arrived 5 s ago, finished 2.25 s ago
            activity.weights.generation_started()
            activity.weights.updated(time.time_ns(), version=4)  # the end-of-step weight sync
    finally:
        unregister(telemetry)
    assert step.stats is not None and step.stats.staleness is not None
    assert (step.stats.staleness.current, step.stats.staleness.max) == (3, 0)


def test_each_version_says_whether_it_was_named_or_counted() -> None:
    versions = WeightVersions()
    assert versions.lookup(5) is None
    versions.updated(100)
    versions.generation_started()
    versions.name(200, "v2")
    versions.name(210, "v2")  # named again (finish_weight_update names through another call)
    versions.updated(300, version="v3")
    assert [versions.lookup(t) for t in (50, 150, 205, 250, 300)] == [
        (0, "counted"),
        (1, "counted"),
        ("v2", "named"),
        ("v2", "named"),
        ("v3", "named"),
    ]
    assert versions.at(250) == "v2"
