"""The one seam into the SDK's internals (``otel_rollout/sdk_internals.py``): a test per private
it touches, through the seam's own functions, on the installed SDK and on the oldest SDK the
package declares (``opentelemetry-sdk>=1.37``, installed into a cached folder on first use).

If one of these fails after an SDK upgrade, the SDK moved something we rely on; what degrades
is said in each test's docstring.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    ExponentialHistogram,
    HistogramDataPoint,
    InMemoryMetricReader,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData
from opentelemetry.sdk.metrics.view import (
    Aggregation,
    DefaultAggregation,
    ExponentialBucketHistogramAggregation,
    View,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_rollout import sdk_internals

REPO = Path(__file__).resolve().parents[2]
OLDEST = {
    "opentelemetry-api": "1.37.0",
    "opentelemetry-sdk": "1.37.0",
    "opentelemetry-semantic-conventions": "0.58b0",
}


@pytest.mark.parametrize("make", [TracerProvider, MeterProvider], ids=["tracer", "meter"])
def test_exit_handler_is_found_and_taken_off_atexit(make: Any, monkeypatch: Any) -> None:
    """Without it the bounded exit cannot replace the SDK's unbounded shutdown at exit: a dead
    collector holds the process for up to the exporter's timeout per signal."""
    unregistered: list[Any] = []
    real = atexit.unregister
    monkeypatch.setattr(atexit, "unregister", lambda f: (unregistered.append(f), real(f)))
    provider = make(shutdown_on_exit=True)
    assert sdk_internals.owns_exit_handler(provider)
    assert sdk_internals.unregister_exit_handler(provider) is True
    assert len(unregistered) == 1
    assert sdk_internals.unregister_exit_handler(provider) is False  # once
    provider.shutdown()
    if make is MeterProvider:  # the meter provider says it is shut down; exit skips it then
        assert not sdk_internals.owns_exit_handler(provider)


def test_a_provider_without_exit_handler_is_not_ours_to_shut() -> None:
    assert not sdk_internals.owns_exit_handler(object())
    assert sdk_internals.unregister_exit_handler(TracerProvider(shutdown_on_exit=False)) is False


class _Pick(sdk_internals.ChoosingAggregation):
    def __init__(self, exponential_for: str, broken: bool = False) -> None:
        self.name = exponential_for
        self.broken = broken
        self.fell_back: list[str] = []

    def choose(self, instrument: Any) -> tuple[Aggregation, Any]:
        if instrument.name != self.name:
            return DefaultAggregation(), None
        if self.broken:
            return _Broken(), sdk_internals.aligned_reservoir([1.0, 2.0])
        return ExponentialBucketHistogramAggregation(), sdk_internals.aligned_reservoir([1.0, 2.0])

    def fallback(self, instrument: Any, chosen: Aggregation, error: Exception) -> Aggregation:
        self.fell_back.append(instrument.name)
        return DefaultAggregation()


class _Broken(Aggregation):
    def _create_aggregation(self, *args: Any, **kwargs: Any) -> Any:
        raise AttributeError("an SDK whose internals moved (fault injection)")


def _record(aggregation: sdk_internals.ChoosingAggregation) -> dict[str, Any]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader],
        views=[View(instrument_type=Histogram, instrument_name="*", aggregation=aggregation)],
    )
    tracer = TracerProvider().get_tracer("t")
    meter = provider.get_meter("m")
    for name in ("tail", "other"):
        with tracer.start_as_current_span("request"):  # a sampled span: exemplars are kept
            meter.create_histogram(name, unit="s").record(1.5)
    data = reader.get_metrics_data()
    assert data is not None
    return {
        m.name: m.data
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


def test_an_aggregation_is_chosen_per_instrument_with_an_aligned_reservoir() -> None:
    """Without it the long-tail histograms stay explicit (coarse quantiles), or the exemplar of
    the slow request is one of 20 random ones."""
    got = _record(_Pick("tail"))
    assert isinstance(got["tail"], ExponentialHistogram)
    assert isinstance(got["other"], HistogramData)
    (point,) = got["tail"].data_points
    (exemplar,) = point.exemplars  # aligned: one per classic bucket, the one holding 1.5
    assert exemplar.value == 1.5 and exemplar.trace_id


def test_an_aggregation_that_fails_to_build_falls_back() -> None:
    pick = _Pick("tail", broken=True)
    got = _record(pick)
    assert isinstance(got["tail"], HistogramData)
    assert isinstance(got["tail"].data_points[0], HistogramDataPoint)
    assert set(pick.fell_back) == {"tail"}  # the SDK builds one per attribute set and reader


def test_a_preset_tracer_uses_the_ids_it_is_given_and_the_providers_processors() -> None:
    """Without it a request's span ids are not known when its record is handed over: step
    analysis, reports and Ray step reports would wait for the background emitter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    clone, preset = sdk_internals.preset_tracer(tracer)
    assert preset is not None and clone is not tracer
    preset.trace_id, preset.span_id = 0x1234, 0x5678
    clone.start_span("preset").end()
    preset.trace_id = preset.span_id = 0
    clone.start_span("drawn").end()
    tracer.start_span("original").end()
    spans = {s.name: s.context for s in exporter.get_finished_spans()}
    assert (spans["preset"].trace_id, spans["preset"].span_id) == (0x1234, 0x5678)
    assert spans["drawn"].span_id not in (0, 0x5678)
    assert spans["original"].span_id != 0x5678


def test_a_tracer_that_is_not_the_sdks_is_left_alone() -> None:
    from opentelemetry.trace import NoOpTracer

    tracer = NoOpTracer()
    assert sdk_internals.preset_tracer(tracer) == (tracer, None)


def test_provider_flushes_run_a_hook_first() -> None:
    """Without it a provider's own ``force_flush()`` misses the records still in our queue (the
    provider-flush tests in ``test_provider_flush.py`` fail)."""
    from otel_rollout import sdk

    sdk.drain_before_provider_flush()  # what the package does, once per process
    for owner in (TracerProvider, MeterProvider):
        for method in ("force_flush", "shutdown"):
            assert hasattr(getattr(owner, method), "__wrapped__"), (owner, method)


def _oldest_sdk() -> Path:
    """A folder with the oldest declared SDK, API and semconv, built once per cache."""
    cache = Path(os.environ.get("OTEL_ROLLOUT_CACHE", Path.home() / ".cache/otel-rollout"))
    folder = cache / ("sdk-" + "-".join(OLDEST.values()))
    if not (folder / ".done").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--target",
                str(folder),
                *(f"{name}=={version}" for name, version in OLDEST.items()),
            ],
            check=True,
            timeout=300,
        )
        (folder / ".done").touch()
    return folder


@pytest.mark.skipif(
    os.environ.get("OTEL_ROLLOUT_OLDEST_SDK") == "1", reason="this is the oldest-SDK run itself"
)
def test_the_seam_holds_on_the_oldest_declared_sdk() -> None:
    folder = _oldest_sdk()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(folder), str(REPO)]),
        "OTEL_ROLLOUT_OLDEST_SDK": "1",
    }
    check = "import opentelemetry.sdk.version as v; print(v.__version__)"
    version = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert version == OLDEST["opentelemetry-sdk"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", __file__],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout
