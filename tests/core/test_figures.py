"""The per-step figures table (``otel_rollout/figures.py``): one entry per figure, consistent."""

from __future__ import annotations

import dataclasses
import typing
from collections import defaultdict

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_rollout import semconv
from otel_rollout.analysis import StepStats, analyze
from otel_rollout.attributes import step_span_attributes, whatif_attributes
from otel_rollout.config import RolloutConfig
from otel_rollout.figures import STEP_FIGURES, step_metrics
from otel_rollout.instruments import StepInstruments
from otel_rollout.record import TrajectoryRecord
from testkit.records import make_record


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} | {
        name for name, value in vars(cls).items() if isinstance(value, property)
    }


def test_every_figure_reads_a_stepstats_value() -> None:
    """Each dotted field walks StepStats' own (optional) parts down to a value."""
    for figure in STEP_FIGURES:
        cls: type = StepStats
        for part in figure.field.split("."):
            assert part in _fields(cls), figure
            if part not in {f.name for f in dataclasses.fields(cls)}:
                break  # a property: the value itself
            hint = typing.get_type_hints(cls)[part]
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            cls = inner[0] if inner else hint
        else:
            assert not dataclasses.is_dataclass(cls), f"{figure.field} ends at a part, not a value"
    assert len({f.field for f in STEP_FIGURES}) == len(STEP_FIGURES)


def test_names_are_unique_and_ours() -> None:
    ours = {v for k, v in vars(semconv).items() if k.isupper() and isinstance(v, str)}
    spans = [f.span_attribute for f in STEP_FIGURES if f.span_attribute]
    assert len(spans) == len(set(spans)) and set(spans) <= ours
    assert {f.metric for f in STEP_FIGURES if f.metric} <= ours


def test_figures_sharing_a_metric_agree_and_say_which_statistic() -> None:
    shared: dict[str, list] = defaultdict(list)
    for figure in STEP_FIGURES:
        if figure.metric:
            shared[figure.metric].append(figure)
    for metric, figures in shared.items():
        assert len({(f.unit, f.description, f.buckets) for f in figures}) == 1, metric
        if len(figures) > 1:
            stats = [f.statistic for f in figures]
            assert None not in stats and len(set(stats)) == len(stats), metric
    assert set(step_metrics()) == set(shared)


def _stats(trajectories: tuple[TrajectoryRecord, ...] = (), versions: bool = False) -> StepStats:
    start = 1_000_000_000_000
    records = [
        make_record(
            "m",
            output_tokens=n,
            arrival_ns=start,
            scheduled_ns=start + 1_000_000,
            first_token_ns=start + 2_000_000,
            finish_ns=start + n * 100_000_000,
            weight_version=(i % 3 if versions else None),
        )
        for i, n in enumerate((4, 8, 8, 16, 64))
    ]
    stats = analyze(records, duration_s=7.0, trajectories=trajectories)
    assert stats is not None
    return stats


def _trajectory(seconds: float, tool_s: float, span_id: int) -> TrajectoryRecord:
    start = 1_000_000_000_000
    end = start + int(seconds * 1e9)
    return TrajectoryRecord(
        agent="a",
        start_ns=start,
        end_ns=end,
        status="completed",
        turns=((start, start + 10),),
        output_tokens=3,
        tools=((start + 10, start + 10 + int(tool_s * 1e9)),),
        scoring=(),
        generation_s=1e-8,
        tool_s=tool_s,
        scoring_s=0.0,
        waiting_s=0.0,
        trace_id=1,
        span_id=span_id,
    )


@pytest.mark.parametrize("with_trajectories", [False, True])
@pytest.mark.parametrize("with_versions", [False, True])
def test_span_attributes_and_points_come_from_the_table(
    with_trajectories: bool, with_versions: bool
) -> None:
    trajectories = (_trajectory(2.0, 1.0, 7), _trajectory(1.0, 0.5, 8)) if with_trajectories else ()
    stats = _stats(trajectories, with_versions)
    attrs = step_span_attributes(stats)
    expected_attrs = {
        f.span_attribute: f.value(stats)
        for f in STEP_FIGURES
        if f.span_attribute and f.value(stats) is not None
    }
    if with_trajectories:
        assert attrs.pop(semconv.STEP_ATTR_SLOWEST_TRAJECTORIES) == [f"{7:016x}", f"{8:016x}"]
        assert expected_attrs[semconv.STEP_TOOL_SHARE] == pytest.approx(0.5)
        assert expected_attrs[semconv.STEP_ATTR_TRAJECTORIES] == 2
    else:
        assert not any(k.startswith("rollout.step.trajector") for k in attrs)
    # the estimates are not figures of the table: their own (tests/core/test_whatif.py)
    estimates = {k: attrs.pop(k) for k in list(attrs) if k.startswith("rollout.step.whatif.")}
    assert stats.whatif is not None and estimates == whatif_attributes(stats.whatif)
    assert len(estimates) == 10
    assert attrs == expected_attrs
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    StepInstruments(provider.get_meter("otel_rollout.steps"), RolloutConfig()).record(
        stats,
        {"gen_ai.request.model": "m"},
        None,  # type: ignore[arg-type]
    )
    data = reader.get_metrics_data()
    assert data is not None
    every = [
        (m, p)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    ]
    points = {
        (m.name, p.attributes.get(semconv.ROLLOUT_STATISTIC)): (m.unit, p.sum, p.count)
        for m, p in every
        if m.name != semconv.STEP_WHATIF_SAVED
    }
    # the estimates' savings: one point per change, by its name
    saved = {
        p.attributes[semconv.ROLLOUT_WHATIF]: p.sum
        for m, p in every
        if m.name == semconv.STEP_WHATIF_SAVED
    }
    assert saved == dict(stats.whatif.savings())
    assert set(saved) == {"cap_p95", "cap_p99", "stop_90", "stop_95"}
    expected = {
        (f.metric, f.statistic): (f.unit, f.value(stats), 1)
        for f in STEP_FIGURES
        if f.metric and f.value(stats) is not None
    }
    assert ((semconv.STEP_TOOL_SHARE, None) in points) == with_trajectories
    assert ((semconv.STEP_STALENESS, "max") in points) == with_versions
    if with_versions:  # versions 0,1,2,0,1 against the newest, 2
        assert attrs[semconv.STEP_ATTR_WEIGHT_VERSION] == 2
        assert attrs[semconv.STEP_ATTR_STALENESS_MAX] == 2
        assert attrs[semconv.STEP_ATTR_STALENESS_MEAN] == pytest.approx(6 / 5)
        assert attrs[semconv.STEP_ATTR_STALE_REQUESTS] == 4
    assert points == expected
