"""The background emitter: bounded, counted when full, ids known at once, fork-safe, drained at exit.

Each test runs on providers of its own (real SDK, in-memory exporter and reader) so what it
counts is only its own. One fault cannot be produced otherwise: an exporter that hangs while the
emitter works; it is injected as a span processor that waits on an event (named FAULT INJECTION).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_rollout.config import RolloutConfig
from otel_rollout.record import RequestRecord
from otel_rollout.steps import rollout_step
from otel_rollout.telemetry import Telemetry
from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.records import make_record

REPO = Path(__file__).resolve().parents[2]


class _HungExporter(SpanProcessor):
    """FAULT INJECTION: an exporter that hangs (collector stalled) until ``release`` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def on_end(self, span: Any) -> None:
        if span.name.startswith("text_completion"):  # the emitter's spans, not the caller's
            self.entered.set()
            self.release.wait(30)


@dataclasses.dataclass
class Pipeline:
    telemetry: Telemetry
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        return [
            p
            for rm in (data.resource_metrics if data else ())
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
            for p in m.data.data_points
        ]

    def request_spans(self) -> list[Any]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith("text_completion")]


def _pipeline(queue: int, *processors: SpanProcessor) -> Pipeline:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    for processor in processors:
        tracer_provider.add_span_processor(processor)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(
        "vllm",
        tracer_provider.get_tracer("tests.emitter"),
        meter_provider.get_meter("tests.emitter"),
        RolloutConfig(emit_queue=queue),
        tracer_provider=tracer_provider,
    )
    return Pipeline(telemetry, spans, reader, tracer_provider)


def _records(n: int, tag: str) -> list[RequestRecord]:
    return [
        make_record("emitter-model", request_id=f"{tag}-{i}", output_tokens=1 + i % 7)
        for i in range(n)
    ]


@pytest.fixture
def hung() -> Iterator[_HungExporter]:
    processor = _HungExporter()
    yield processor
    processor.release.set()


def test_full_queue_drops_counts_and_warns_once_without_blocking(
    hung: _HungExporter, caplog: Any
) -> None:
    p = _pipeline(100, hung)
    p.telemetry.emit(make_record("emitter-model", request_id="first"))
    assert hung.entered.wait(10)  # the emitter is now stuck in the exporter with that record
    with caplog.at_level(logging.WARNING, logger="otel_rollout"):
        started = time.monotonic()
        p.telemetry.emit_all(_records(150, "burst"))  # 99 fit beside the stuck one
        p.telemetry.emit_all(_records(10, "late"))  # nothing fits
        handed_over = time.monotonic() - started
    assert handed_over < 1.0, f"a full queue blocked the caller for {handed_over:.2f} s"
    (dropped,) = p.points("rollout.telemetry.dropped")
    assert dropped.value == 51 + 10
    assert dict(dropped.attributes) == {
        "gen_ai.provider.name": "vllm",
        "rollout.drop.reason": "queue_full",
    }
    warnings = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warnings) == 1 and "OTEL_ROLLOUT_EMIT_QUEUE" in warnings[0]

    hung.release.set()
    assert p.telemetry.flush(30)
    ids = [s.attributes["gen_ai.response.id"] for s in p.request_spans()]
    assert ids == ["first"] + [f"burst-{i}" for i in range(99)]  # in order; the excess is dropped
    (duration,) = p.points("gen_ai.server.request.duration")
    assert duration.count == 1 + 150 + 10  # spans dropped, counts never: every request counted


def test_ids_are_drawn_in_the_caller_and_the_spans_carry_them(hung: _HungExporter) -> None:
    p = _pipeline(1000, hung)
    tracer = p.tracer_provider.get_tracer("tests.emitter.parent")
    with tracer.start_as_current_span("trainer") as parent:
        with rollout_step(3, telemetry=p.telemetry) as step:
            records = _records(20, "ids")
            p.telemetry.emit_all(records)
            assert hung.entered.wait(10)
    # The step ended and analysed while the emitter was stuck: it had every record and its ids.
    assert step.stats is not None and step.stats.requests == 20
    trace_id = parent.get_span_context().trace_id
    assert all(r.trace_id == trace_id and r.span_id for r in records)
    assert len({r.span_id for r in records}) == 20
    stragglers = {s.span_id for s in step.stats.stragglers}
    assert stragglers and stragglers <= {format(r.span_id, "016x") for r in records}

    hung.release.set()
    assert p.telemetry.flush(30)
    spans = {s.attributes["gen_ai.response.id"]: s for s in p.request_spans()}
    assert len(spans) == 20
    for record in records:
        span = spans[record.request_id]
        assert (span.context.trace_id, span.context.span_id) == (record.trace_id, record.span_id)
        assert span.attributes["rollout.step"] == 3
    (duration,) = p.points("gen_ai.server.request.duration")
    assert duration.count == 20 and duration.exemplars
    by_id = {s.context.span_id: s for s in spans.values()}
    for exemplar in duration.exemplars:
        span = by_id[exemplar.span_id]
        assert exemplar.value == pytest.approx((span.end_time - span.start_time) / 1e9)


def test_single_records_under_one_parent_are_emitted_together_in_order() -> None:
    """A stream hands over one record at a time: queued ones under the same parent are emitted
    as one batch (one record at a time cost ~20 µs a record more); another parent's are not
    joined to them, and the order is kept."""
    from otel_rollout.emitter import Emitter

    calls: list[tuple[list[str], Any]] = []
    first_in, go_on = threading.Event(), threading.Event()

    def sink(records: Any, parent: Any, spans: bool) -> None:
        if not calls:
            first_in.set()
            go_on.wait(10)  # hold the emitter so the rest queue up behind this one
        calls.append(([r.request_id for r in records], parent))

    emitter = Emitter(sink, 1000)
    one = otel_context.set_value("tests.emitter.parent", 1)
    other = otel_context.set_value("tests.emitter.parent", 2)
    emitter.submit(_records(1, "held"), one)
    assert first_in.wait(10)
    for record in _records(5, "a"):
        emitter.submit([record], one)
    emitter.submit(_records(1, "b"), other)
    emitter.submit(_records(2, "c"), one)
    go_on.set()
    assert emitter.flush(10) and emitter.pending == 0
    assert calls == [
        (["held-0"], one),
        ([f"a-{i}" for i in range(5)], one),  # five submissions, one batch
        (["b-0"], other),
        (["c-0", "c-1"], one),
    ]


@pytest.mark.parametrize("queue", [262_144, 0], ids=["background", "inline"])
def test_every_record_of_a_10k_call_arrives(queue: int) -> None:
    p = _pipeline(queue)
    records = _records(10_000, "big")
    p.telemetry.emit_all(records, otel_context.get_current())
    if queue == 0:
        assert p.telemetry._emitter is None  # inline: done before emit_all returned
    assert p.telemetry.flush(120)
    spans = p.request_spans()
    assert len(spans) == 10_000
    assert {s.attributes["gen_ai.response.id"] for s in spans} == {r.request_id for r in records}
    data = p.reader.get_metrics_data()  # one collection: exemplars belong to the interval
    metrics = {
        m.name: m.data.data_points
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    (duration,) = metrics["gen_ai.server.request.duration"]
    assert duration.count == 10_000
    tokens = [
        pt
        for pt in metrics["gen_ai.client.token.usage"]
        if pt.attributes["gen_ai.token.type"] == "output"
    ]
    assert sum(pt.count for pt in tokens) == 10_000
    assert sum(pt.sum for pt in tokens) == sum(r.output_tokens for r in records)
    by_id = {s.context.span_id: s for s in spans}
    assert duration.exemplars
    for exemplar in duration.exemplars:  # each points at the request span it was recorded for
        span = by_id[exemplar.span_id]
        assert exemplar.value == pytest.approx((span.end_time - span.start_time) / 1e9)


def test_a_forked_child_emits_its_own_records() -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    p = _pipeline(262_144)
    p.telemetry.emit_all(_records(5_000, "parent"))  # still being emitted when the fork happens
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its emitter thread did not survive the fork; a new one must start
        code = 1
        try:
            inherited = len(p.request_spans())
            p.telemetry.emit_all(_records(50, "child"))
            ok = p.telemetry.flush(60)
            spans = p.request_spans()
            report = {
                "ok": ok,
                "child": sorted(
                    s.attributes["gen_ai.response.id"]
                    for s in spans
                    if s.attributes["gen_ai.response.id"].startswith("child")
                ),
                "parent_added": len(spans) - inherited - 50,
            }
            os.write(write_end, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        report = json.loads(pipe.read())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report["ok"]
    assert report["child"] == sorted(f"child-{i}" for i in range(50))
    assert report["parent_added"] == 0  # the parent's queued records are the parent's to emit
    assert p.telemetry.flush(60)
    assert (
        len(
            [
                s
                for s in p.request_spans()
                if s.attributes["gen_ai.response.id"].startswith("parent")
            ]
        )
        == 5_000
    )


_EXIT_JOB = """
import sys, time
from testkit.otlp_job import sdk_over_otlp

endpoint, count = sys.argv[1], int(sys.argv[2])
traces = sys.argv[3] if len(sys.argv) > 3 else endpoint  # the span exporter may go elsewhere
warm = int(sys.argv[4]) if len(sys.argv) > 4 else 0  # records emitted, and exported, first
tp = sdk_over_otlp(endpoint, traces)

from otel_rollout.instrumentation import build_telemetry
from otel_rollout.record import RequestRecord
from otel_rollout.sdk import bound_exit

telemetry = build_telemetry("vllm", {})
bound_exit(telemetry.config.exit_timeout)  # what EngineInstrumentor.instrument() does
def records(first, last):
    now = time.time_ns()
    return [RequestRecord(provider="vllm", model="exit-job", operation="text_completion",
                          arrival_ns=now - 10**9, finish_ns=now, request_id=f"exit-{i}",
                          output_tokens=1) for i in range(first, last)]

if warm:  # the collector has been answering (slowly) before the exit
    telemetry.emit_all(records(0, warm))
    tp.force_flush()
telemetry.emit_all(records(warm, count))
print("PENDING", telemetry._emitter.pending if telemetry._emitter else 0, flush=True)
"""


@pytest.mark.parametrize("queue", ["262144", "0"], ids=["background", "inline"])
def test_exit_with_records_pending_exports_them_all(
    queue: str, otlp_receiver: OTLPReceiver
) -> None:
    count = 10_000
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(PYTHONPATH=str(REPO), OTEL_ROLLOUT_EMIT_QUEUE=queue)
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_JOB, otlp_receiver.grpc_endpoint, str(count)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    pending = int(proc.stdout.split("PENDING")[1].split()[0])
    if queue != "0":
        assert pending > 0, "the job exited with nothing pending: the test tests nothing"
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= count, timeout=30)
    ids = {attr(s.attributes, "gen_ai.response.id") for s in otlp_receiver.spans()}
    assert ids == {f"exit-{i}" for i in range(count)}
    durations = [m for m in otlp_receiver.metrics() if m.name == "gen_ai.server.request.duration"]
    assert sum(p.count for p in durations[-1].histogram.data_points) == count
    assert "Queue full" not in proc.stderr


def _exit_job(
    metrics_endpoint: str, count: int, traces_endpoint: str | None = None, warm: int = 0
) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(PYTHONPATH=str(REPO))
    args = [sys.executable, "-c", _EXIT_JOB, metrics_endpoint, str(count)]
    args += [traces_endpoint or metrics_endpoint, str(warm)]
    started = time.monotonic()
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, time.monotonic() - started


def _duration_count(receiver: OTLPReceiver) -> int:
    durations = [m for m in receiver.metrics() if m.name == "gen_ai.server.request.duration"]
    return sum(p.count for p in durations[-1].histogram.data_points) if durations else 0


def test_exit_with_a_dead_span_exporter_still_records_every_count(
    otlp_receiver: OTLPReceiver,
) -> None:
    """Spans go to a closed port (never answers); metric points to a working receiver. A
    bounded exit may drop spans, never counts: all 20,000 requests are in the histogram."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    count = 20_000
    proc, took = _exit_job(otlp_receiver.grpc_endpoint, count, traces_endpoint=closed)
    pending = int(proc.stdout.split("PENDING")[1].split()[0])
    assert pending > 0, "the job exited with nothing pending: the test tests nothing"
    assert otlp_receiver.wait_for(lambda r: _duration_count(r) > 0, timeout=30)
    assert _duration_count(otlp_receiver) == count
    assert "span(s) were not made at exit" in proc.stderr
    assert "metric points were recorded" in proc.stderr
    assert took < 30, took


def test_exit_waits_for_a_slow_span_exporter_that_answers() -> None:
    """Each trace export is answered 1.6 s late — slower than OTEL_ROLLOUT_EXIT_TIMEOUT (1.5 s),
    faster than the exporter's own 10 s timeout: a slow collector, not a dead one. Every span
    arrives. (Before: one drain over 1.5 s counted as stuck and the rest was dropped.)"""
    slow = OTLPReceiver(trace_delay_s=1.6).start()
    try:
        warm, count = 600, 600 + 2_048
        proc, took = _exit_job(slow.grpc_endpoint, count, warm=warm)
        pending = int(proc.stdout.split("PENDING")[1].split()[0])
        assert pending > 0, "the job exited with nothing pending: the test tests nothing"
        assert len(slow.spans()) == count, (len(slow.spans()), proc.stderr[-2000:])
        assert _duration_count(slow) == count
        assert "not made at exit" not in proc.stderr, proc.stderr[-3000:]
    finally:
        slow.stop()


def test_in_flight_of_several_emitters_on_one_meter_all_report() -> None:
    """The observables are registered once per meter; every Telemetry on it is reported."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("tests.shared")
    tracer = TracerProvider().get_tracer("tests.shared")
    first, second = (Telemetry("vllm", tracer, meter, RolloutConfig()) for _ in range(2))
    first.requests_started("model-a", "text_completion", 3)
    second.requests_started("model-b", "chat", 4)
    second.requests_started("model-a", "text_completion", 2)  # same labels: the counts add up

    def points(name: str) -> dict[tuple[str, str], float]:
        data = reader.get_metrics_data()
        return {
            (
                p.attributes["gen_ai.request.model"],
                p.attributes.get("gen_ai.operation.name", ""),
            ): p.value
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
            for p in m.data.data_points
        }

    assert points("rollout.requests.active") == {
        ("model-a", "text_completion"): 5,
        ("model-b", "chat"): 4,
    }
    assert set(points("rollout.engine.busy_time")) == {("model-a", ""), ("model-b", "")}
    first.requests_ended("model-a", "text_completion", 3)
    second.requests_ended("model-b", "chat", 4)
    second.requests_ended("model-a", "text_completion", 2)
    assert points("rollout.requests.active") == {
        ("model-a", "text_completion"): 0,
        ("model-b", "chat"): 0,
    }
