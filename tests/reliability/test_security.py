"""No prompt or response text leaves the process unless asked; no OTLP header value is logged.

Content: vLLM is re-instrumented onto OTLP exporters (traces over gRPC, metrics over HTTP) that
point at the real receiver, and the bytes it received are searched for a canary prompt and for
the responses' text. Headers: the exporter-trouble jobs ran under ``opentelemetry-instrument``
with DEBUG logging and ``OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer <secret>``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_rollout import VLLMInstrumentor
from testkit.otlp_receiver import OTLPReceiver, attr
from tests.reliability.jobs import SECRET

pytestmark = pytest.mark.vllm

CANARY = "CANARY-4b1d-PROMPT the quick brown fox"
LIMIT = 12


@pytest.fixture
def otlp_instrumented(
    instrumented: Any, otlp_receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """Re-instrument vLLM onto OTLP providers; the session's instrumentation is restored after."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=otlp_receiver.grpc_endpoint, insecure=True))
    )
    meter_provider = MeterProvider(
        metric_readers=[
            PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=f"{otlp_receiver.http_endpoint}/v1/metrics"),
                export_interval_millis=3_600_000,
            )
        ]
    )
    inst = VLLMInstrumentor()

    def start() -> None:
        inst.uninstrument()
        inst.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)

    def flush() -> None:
        assert tracer_provider.force_flush(10_000) and meter_provider.force_flush(10_000)

    try:
        yield start, flush
    finally:
        inst.uninstrument()
        monkeypatch.undo()
        inst.instrument()
        tracer_provider.shutdown()
        meter_provider.shutdown()


def _run(llm: Any, engine: Any, vllm_module: Any, loop: asyncio.AbstractEventLoop) -> list[str]:
    params = vllm_module.SamplingParams(max_tokens=16, ignore_eos=True, seed=3, temperature=1.0)
    texts = [
        o.outputs[0].text for o in llm.generate([CANARY, CANARY + " 2"], params, use_tqdm=False)
    ]
    texts += [
        o.outputs[0].text
        for o in llm.chat([{"role": "user", "content": CANARY}], params, use_tqdm=False)
    ]

    async def stream() -> str:
        text = ""
        async for out in engine.generate(CANARY, params, "sec-async"):
            text = out.outputs[0].text
        return text

    texts.append(loop.run_until_complete(stream()))
    return texts


def test_content_off_nothing_exported_or_logged(
    otlp_instrumented: Any,
    otlp_receiver: OTLPReceiver,
    llm: Any,
    async_engine: Any,
    vllm_module: Any,
    aloop: asyncio.AbstractEventLoop,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", raising=False)
    start, flush = otlp_instrumented
    start()
    with caplog.at_level(logging.DEBUG):
        texts = _run(llm, async_engine, vllm_module, aloop)
        flush()
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= 4 and r.metrics())
    raw = b"".join(otlp_receiver.raw)
    assert b"gen_ai.usage.output_tokens" in raw  # the search looks at real exports
    assert b"CANARY" not in raw
    for text in texts:
        if len(text) >= 8:  # long enough not to match by chance
            assert text.encode() not in raw, text
    ours = [r for r in caplog.records if r.name.startswith(("otel_rollout", "opentelemetry"))]
    assert not any("CANARY" in r.getMessage() for r in ours)


def test_content_on_truncated_at_limit(
    otlp_instrumented: Any,
    otlp_receiver: OTLPReceiver,
    llm: Any,
    async_engine: Any,
    vllm_module: Any,
    aloop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    monkeypatch.setenv("OTEL_ROLLOUT_CONTENT_MAX_LENGTH", str(LIMIT))
    start, flush = otlp_instrumented
    start()
    texts = _run(llm, async_engine, vllm_module, aloop)
    flush()
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= 4)
    raw = b"".join(otlp_receiver.raw)
    assert CANARY[:LIMIT].encode() in raw
    assert CANARY[: LIMIT + 1].encode() not in raw
    contents = []
    for span in otlp_receiver.spans():
        for key in ("gen_ai.input.messages", "gen_ai.output.messages"):
            value = attr(span.attributes, key)
            if value:
                contents += [p["content"] for m in json.loads(value) for p in m["parts"]]
    assert contents and all(len(c) <= LIMIT for c in contents)
    assert any(t[:LIMIT] in contents for t in texts if t)
    for _, value in ((m.name, m) for m in otlp_receiver.metrics()):
        assert CANARY[:LIMIT].encode() not in value.SerializeToString()  # never on metrics


def test_no_header_value_in_debug_logs(exporter_jobs: dict[str, Any]) -> None:
    collector = exporter_jobs["_error_collector"]
    sent = [h.get("authorization") for h in collector.headers]
    assert f"Bearer {SECRET}" in sent, "the header really was configured and sent"
    for name, job in exporter_jobs.items():
        if name.startswith("_"):
            continue
        assert "DEBUG job: debug logging is on" in job.stderr, name  # DEBUG really was on
        assert SECRET not in job.stdout and SECRET not in job.stderr, name
        assert "exporter trouble" not in job.stderr, name  # nor prompt text (capture off)
