"""Configuration: malformed values warn once and fall back; bucket overrides reach the histograms."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from otel_rollout import config as cfg
from otel_rollout.config import SETTINGS, RolloutConfig, load_config
from otel_rollout.instrumentation import build_telemetry
from otel_rollout.telemetry import Telemetry
from testkit.records import make_record
from tests.conftest import OTelHarness

_BY_ENV = {s.env: s for s in SETTINGS}

# (variable, malformed value) — at least one per setting that can be malformed at all.
MALFORMED = [
    ("OTEL_ROLLOUT_LATENCY_BUCKETS", "fast,slow"),
    ("OTEL_ROLLOUT_LATENCY_BUCKETS", "1,0.5,2"),  # not increasing
    ("OTEL_ROLLOUT_LATENCY_BUCKETS", "-1,2"),  # negative
    ("OTEL_ROLLOUT_LATENCY_BUCKETS", "1,,2"),  # empty entry
    ("OTEL_ROLLOUT_LATENCY_BUCKETS", "1,inf"),
    ("OTEL_ROLLOUT_TTFT_BUCKETS", "nan"),
    ("OTEL_ROLLOUT_TPOT_BUCKETS", ",".join(str(i) for i in range(1, 300))),  # too many
    ("OTEL_ROLLOUT_TOKEN_BUCKETS", "1;2;3"),
    ("OTEL_ROLLOUT_HISTOGRAMS", "native"),
    ("OTEL_ROLLOUT_CONTENT_MAX_LENGTH", "lots"),
    ("OTEL_ROLLOUT_CONTENT_MAX_LENGTH", "-1"),
    ("OTEL_ROLLOUT_CONTENT_MAX_LENGTH", "1.5"),
    ("OTEL_ROLLOUT_TAIL_QUANTILE", "1"),
    ("OTEL_ROLLOUT_TAIL_QUANTILE", "ninety"),
    ("OTEL_ROLLOUT_STEP_SUMMARY", "sometimes"),
    ("OTEL_ROLLOUT_SUMMARY_STRAGGLERS", "1001"),
    ("OTEL_ROLLOUT_BATCH_AS_STEP", "2"),
    ("OTEL_ROLLOUT_REPORT_DIR", "/tmp/a\x00b"),
    ("OTEL_ROLLOUT_STEP_LOG", "\x00"),
    ("OTEL_ROLLOUT_RUN_ID", "run\x07"),
    ("OTEL_ROLLOUT_HTTP_PATHS", "v1/completions"),  # not a path
    ("OTEL_ROLLOUT_HTTP_PATHS", "/generate,,/v1/completions"),  # empty entry
    ("OTEL_ROLLOUT_EXIT_TIMEOUT", "soon"),
    ("OTEL_ROLLOUT_EXIT_TIMEOUT", "-1"),
    ("OTEL_ROLLOUT_STALL_TIMEOUT", "forever"),
    ("OTEL_ROLLOUT_STALL_TIMEOUT", "-5"),
    ("OTEL_ROLLOUT_STEP_WAIT", "a while"),
    ("OTEL_ROLLOUT_STEP_WAIT", "-2"),
    ("OTEL_ROLLOUT_EMIT_QUEUE", "big"),
    ("OTEL_ROLLOUT_EMIT_QUEUE", "-1"),
    ("OTEL_ROLLOUT_SAMPLE_RATE", "2"),
    ("OTEL_ROLLOUT_SAMPLE_RATE", "a few"),
    ("OTEL_ROLLOUT_SAMPLE_MIN_STEP", "many"),
    ("OTEL_ROLLOUT_SAMPLE_SLOWEST", "-1"),
    ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "perhaps"),
]


def test_every_setting_has_a_malformed_case() -> None:
    assert {s.env for s in SETTINGS} <= {env for env, _ in MALFORMED}


@pytest.mark.parametrize("env, value", MALFORMED, ids=[f"{e}={v[:12]!r}" for e, v in MALFORMED])
def test_malformed_value_warns_once_and_uses_default(env: str, value: str, caplog) -> None:
    if env not in _BY_ENV and env != cfg.CAPTURE_CONTENT_ENV:
        pytest.skip(f"{env} is not a setting of this version")
    with caplog.at_level(logging.WARNING, logger="otel_rollout"):
        config = load_config({env: value})
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert env in message
    assert repr(value) in message
    if env in _BY_ENV:
        setting = _BY_ENV[env]
        assert f"default {setting.render(setting.default)}" in message
        assert getattr(config, setting.attr) == setting.default
    else:
        assert "default false" in message
        assert config.capture_content is False
    (problem,) = config.problems
    assert problem.variable == env and problem.value == value
    assert config == RolloutConfig()  # every other value is the default too


def test_a_retired_variable_is_reported_with_what_replaced_it(caplog) -> None:
    """OTEL_ROLLOUT_SAMPLE_TAIL is gone (#40: one tail): a user who still sets it is told that
    it is not read and which setting decides now, and nothing else changes."""
    with caplog.at_level(logging.WARNING, logger="otel_rollout"):
        config = load_config(
            {"OTEL_ROLLOUT_SAMPLE_TAIL": "0.95", "OTEL_ROLLOUT_TAIL_QUANTILE": "0.8"}
        )
    (problem,) = config.problems
    assert (problem.variable, problem.value) == ("OTEL_ROLLOUT_SAMPLE_TAIL", "0.95")
    assert problem.default == "OTEL_ROLLOUT_TAIL_QUANTILE=0.8"
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "no longer read" in warning and "OTEL_ROLLOUT_TAIL_QUANTILE=0.8" in warning
    assert config.tail_quantile == 0.8 and not hasattr(config, "sample_tail")
    assert set(cfg.RETIRED).isdisjoint(s.env for s in SETTINGS)


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_is_unset(value: str, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_rollout"):
        config = load_config({s.env: value for s in SETTINGS})
    assert caplog.records == []
    assert config == RolloutConfig() and config.problems == ()


def test_valid_values_are_parsed() -> None:
    config = load_config(
        {
            "OTEL_ROLLOUT_LATENCY_BUCKETS": " 0.5, 1 ,30 ",
            "OTEL_ROLLOUT_CONTENT_MAX_LENGTH": "0",
            "OTEL_ROLLOUT_TAIL_QUANTILE": "0.75",
            "OTEL_ROLLOUT_STEP_SUMMARY": "yes",
            "OTEL_ROLLOUT_SUMMARY_STRAGGLERS": "0",
            "OTEL_ROLLOUT_BATCH_AS_STEP": "ON",
            "OTEL_ROLLOUT_STEP_LOG": "~/steps.jsonl",
        }
    )
    assert config.problems == ()
    assert config.latency_buckets == (0.5, 1.0, 30.0)
    assert type(config.content_max_length) is int and config.content_max_length == 0
    assert config.tail_quantile == 0.75
    assert config.step_summary is True and config.batch_as_step is True
    assert config.summary_stragglers == 0
    assert not config.step_log.startswith("~")


def test_warn_false_is_silent(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_rollout"):
        config = load_config({"OTEL_ROLLOUT_TAIL_QUANTILE": "2"}, warn=False)
    assert caplog.records == []
    assert len(config.problems) == 1


# --- bucket overrides reach the SDK's histograms --------------------------------------------

BUCKET_CASES = [
    (
        "OTEL_ROLLOUT_LATENCY_BUCKETS",
        ("gen_ai.server.request.duration", "rollout.request.queue_time"),
    ),
    ("OTEL_ROLLOUT_TTFT_BUCKETS", ("gen_ai.server.time_to_first_token",)),
    ("OTEL_ROLLOUT_TPOT_BUCKETS", ("gen_ai.server.time_per_output_token",)),
    ("OTEL_ROLLOUT_TOKEN_BUCKETS", ("gen_ai.client.token.usage",)),
]
CUSTOM = "0.125,0.5,3,7.5,1000"
CUSTOM_BOUNDS = (0.125, 0.5, 3.0, 7.5, 1000.0)


def _bounds(reader: InMemoryMetricReader, model: str) -> dict[str, set[tuple[float, ...]]]:
    out: dict[str, set[tuple[float, ...]]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    if p.attributes.get("gen_ai.request.model") == model:
                        out.setdefault(m.name, set()).add(tuple(p.explicit_bounds))
    return out


@pytest.mark.parametrize("env, names", BUCKET_CASES, ids=[e for e, _ in BUCKET_CASES])
def test_bucket_override_on_a_new_meter_provider(
    env: str, names: tuple[str, ...], monkeypatch: Any
) -> None:
    """The instrumentor's own path: env var → load_config → advisory on the instrument."""
    monkeypatch.setenv(env, CUSTOM)
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = build_telemetry(
        "vllm", {"meter_provider": meter_provider, "tracer_provider": TracerProvider()}
    )
    telemetry.emit(make_record("bucket-model"))
    assert telemetry.flush(30.0)  # records are emitted in the background
    bounds = _bounds(reader, "bucket-model")
    for name in names:
        assert bounds[name] == {CUSTOM_BOUNDS}, name
    untouched = set(bounds) - set(names)
    assert untouched, "other histograms were recorded too"
    for name in untouched:
        assert bounds[name] != {CUSTOM_BOUNDS}, name
    meter_provider.shutdown()


@pytest.mark.parametrize("env, names", BUCKET_CASES, ids=[e for e, _ in BUCKET_CASES])
def test_bucket_override_under_an_existing_meter_provider(
    env: str, names: tuple[str, ...], otel: OTelHarness, model: str
) -> None:
    """The session's global provider was created long before this configuration was read."""
    config = load_config({env: CUSTOM})
    scope = f"tests.core.buckets.{env}"  # fresh instruments: the SDK keeps an instrument's first advisory
    telemetry = Telemetry(
        "vllm", otel.tracer_provider.get_tracer(scope), otel.meter_provider.get_meter(scope), config
    )
    telemetry.emit(make_record(model))
    points = {
        name: [p for p in otel.metric_points(name) if p.attributes["gen_ai.request.model"] == model]
        for name in names
    }
    for name in names:
        assert points[name], name
        assert {tuple(p.point.explicit_bounds) for p in points[name]} == {CUSTOM_BOUNDS}, name


def test_default_buckets_reach_the_histograms(model: str) -> None:
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(
        "vllm", TracerProvider().get_tracer("t"), meter_provider.get_meter("t"), RolloutConfig()
    )
    telemetry.emit(make_record(model))
    assert telemetry.flush(30.0)  # records are emitted in the background
    bounds = _bounds(reader, model)
    assert bounds["gen_ai.server.request.duration"] == {cfg.DEFAULT_LATENCY_BUCKETS}
    assert bounds["gen_ai.server.time_to_first_token"] == {cfg.DEFAULT_TTFT_BUCKETS}
    assert bounds["gen_ai.server.time_per_output_token"] == {cfg.DEFAULT_TPOT_BUCKETS}
    assert bounds["gen_ai.client.token.usage"] == {cfg.DEFAULT_TOKEN_BUCKETS}
    # RL responses run for minutes to hours: the latency buckets go well past semconv's ~82 s.
    assert max(cfg.DEFAULT_LATENCY_BUCKETS) >= 3600
