"""Fixtures shared by every test: in-memory OTel pipeline, a real OTLP receiver, the tiny model.

The OTel API allows one global tracer/meter provider per process, so they are installed once per
session; each test starts from an empty span exporter and sees metric points relative to where
they stood when it began (the reader is cumulative; ``_Delta`` subtracts the test's baseline).
Also here: the vLLM fixtures every engine suite shares, and the session's process hygiene (the
test process reaps what its tests left running).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from testkit.engines import VLLM_KWARGS, vllm_environment
from testkit.otlp_receiver import OTLPReceiver
from testkit.processes import become_subreaper, descendant_pids, end_new, reap_zombies

REPO = Path(__file__).resolve().parent.parent


_AT_START: set[int] = set()


def pytest_configure(config: Any) -> None:
    """Orphans of what the tests start (Ray workers of a finished job) stay ours to end.

    Ray starts its workers at nice 15 (``RAY_worker_niceness``): beside any normal-priority load
    (other jobs on a shared CI machine, ``scripts/test --under-load``) they get a sliver of the
    CPU, and an actor building a vLLM engine did not start in 300 s beside two busy processes.
    The suite's clusters (in this process and in the jobs it starts, which inherit the
    environment) run their workers at the priority of the test itself.
    """
    become_subreaper()
    _AT_START.update(descendant_pids())
    os.environ.setdefault("RAY_worker_niceness", "0")


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Nothing of the suite is left running: whatever survived its test is ended, and named."""
    killed = end_new(_AT_START, grace_s=5.0)
    reap_zombies()
    if killed:
        print(f"\n[tests] ended {len(killed)} process(es) left running: {killed}", file=sys.stderr)


class OTelHarness:
    """The session's global providers, seen per test."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def reset(self) -> None:
        self.spans.clear()
        self._baseline = self._points()

    def finished_spans(self) -> list[Any]:
        flush_emitters()
        return list(self.spans.get_finished_spans())

    def gauge(self, name: str, model: str) -> float | None:
        """The current value of gauge ``name`` for ``model`` (no baseline: a gauge is a now)."""
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            if point.attributes.get("gen_ai.request.model") == model:
                                return float(point.value)
        return None

    def _points(self) -> dict[tuple[str, frozenset[Any]], Any]:
        flush_emitters()
        data = self.reader.get_metrics_data()
        out: dict[tuple[str, frozenset[Any]], Any] = {}
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points:
                        out[(m.name, frozenset(p.attributes.items()))] = p
        return out

    def metric_points(self, name: str) -> list[Any]:
        """This test's points of ``name`` (cumulative points minus the test's starting point)."""
        result = []
        for (metric, attrs), point in self._points().items():
            if metric != name:
                continue
            base = self._baseline.get((metric, attrs))
            result.append(_Delta(point, base))
        return [p for p in result if p.count or p.value]


class _Delta:
    """A cumulative point seen relative to where it stood when the test began."""

    def __init__(self, point: Any, base: Any) -> None:
        self.point = point
        self.attributes = dict(point.attributes)
        if hasattr(point, "count"):
            self.count = point.count - (base.count if base else 0)
            self.sum = point.sum - (base.sum if base else 0)
            self.bucket_counts = [
                a - (b if base else 0)
                for a, b in zip(
                    point.bucket_counts,
                    base.bucket_counts if base else [0] * len(point.bucket_counts),
                    strict=False,
                )
            ]
            self.value = None
        else:
            self.count = 0
            self.value = point.value - (base.value if base else 0)
        self.exemplars = list(getattr(point, "exemplars", []) or [])


def flush_emitters() -> None:
    """Where a user reads telemetry (``otel_rollout.sdk.force_flush``), the harness reads it too:
    request records are emitted on a background thread, so wait until it has caught up."""
    from otel_rollout.emitter import flush_all

    assert flush_all(60.0), "the background emitter did not catch up within 60 s"


_HARNESS: OTelHarness | None = None


@pytest.fixture(scope="session")
def otel_session() -> OTelHarness:
    global _HARNESS
    if _HARNESS is None:
        _HARNESS = OTelHarness()
        trace.set_tracer_provider(_HARNESS.tracer_provider)
        metrics.set_meter_provider(_HARNESS.meter_provider)
    return _HARNESS


@pytest.fixture
def otel(otel_session: OTelHarness) -> OTelHarness:
    otel_session.reset()
    return otel_session


@pytest.fixture
def otlp_receiver() -> Iterator[OTLPReceiver]:
    receiver = OTLPReceiver().start()
    yield receiver
    receiver.stop()


def _engine_required(name: str) -> bool:
    return name in os.environ.get("OTEL_ROLLOUT_REQUIRE_ENGINES", "").split(",")


def require_module(name: str) -> Any:
    """Import an engine; skip when absent unless the test runner said it must be present."""
    if _engine_required(name):
        return __import__(name)
    return pytest.importorskip(name)


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Path of the locally built random-weights Llama (built once, cached across runs)."""
    path = os.environ.get("OTEL_ROLLOUT_TINY_MODEL")
    if path and Path(path, ".complete").exists():
        return path
    import sys

    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_tiny_model.py")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


# --- vLLM: shared by every suite that runs it (vllm, steps, e2e, reliability, compat) ----------


@pytest.fixture(scope="session")
def vllm_module() -> Any:
    vllm_environment()
    return require_module("vllm")


@pytest.fixture(scope="session")
def instrumented(otel_session: OTelHarness, vllm_module: Any) -> Iterator[Any]:
    from otel_rollout import VLLMInstrumentor

    instrumentor = VLLMInstrumentor()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture(scope="session")
def llm(vllm_module: Any, tiny_model: str, instrumented: Any) -> Any:
    """A plain LLM(): engine stats off, as vLLM defaults."""
    return vllm_module.LLM(model=tiny_model, **VLLM_KWARGS)


@pytest.fixture(scope="session")
def llm_stats(vllm_module: Any, tiny_model: str, instrumented: Any) -> Any:
    return vllm_module.LLM(model=tiny_model, disable_log_stats=False, **VLLM_KWARGS)
