"""The per-step figures table (``otel_rollout/figures.py``): one entry per figure, consistent."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_rollout import semconv
from otel_rollout.analysis import StepStats, analyze
from otel_rollout.attributes import step_span_attributes
from otel_rollout.config import RolloutConfig
from otel_rollout.figures import STEP_FIGURES, step_metrics
from otel_rollout.instruments import StepInstruments
from testkit.records import make_record


def test_every_figure_reads_a_stepstats_value() -> None:
    fields = {f.name for f in dataclasses.fields(StepStats)} | {
        name for name, value in vars(StepStats).items() if isinstance(value, property)
    }
    assert {f.field for f in STEP_FIGURES} <= fields
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


def _stats() -> StepStats:
    start = 1_000_000_000_000
    records = [
        make_record(
            "m",
            output_tokens=n,
            arrival_ns=start,
            scheduled_ns=start + 1_000_000,
            first_token_ns=start + 2_000_000,
            finish_ns=start + n * 100_000_000,
        )
        for n in (4, 8, 8, 16, 64)
    ]
    stats = analyze(records, duration_s=7.0)
    assert stats is not None
    return stats


def test_span_attributes_and_points_come_from_the_table() -> None:
    stats = _stats()
    attrs = step_span_attributes(stats)
    assert attrs == {
        f.span_attribute: getattr(stats, f.field) for f in STEP_FIGURES if f.span_attribute
    }
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    StepInstruments(provider.get_meter("otel_rollout.steps"), RolloutConfig()).record(
        stats,
        {"gen_ai.request.model": "m"},
        None,  # type: ignore[arg-type]
    )
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        (m.name, p.attributes.get(semconv.ROLLOUT_STATISTIC)): (m.unit, p.sum, p.count)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    }
    expected = {
        (f.metric, f.statistic): (f.unit, getattr(stats, f.field), 1)
        for f in STEP_FIGURES
        if f.metric
    }
    assert points == expected
