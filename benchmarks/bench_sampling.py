"""Figure 9: spans and bytes a step exports, every span vs step-aware sampling (issue #19).

No engine runs: a real ``Telemetry`` and the real SDK make the spans of one ``rollout_step`` of
N long-tailed requests submitted together (1 % truncated, finishing in latency order), once with
``OTEL_ROLLOUT_SAMPLE_RATE=1`` (every span) and once with ``0.02`` (the default). Each exported
span is encoded as OTLP/protobuf (the exporter's own encoder, 512 spans per export request as the
SDK's batch processor sends them) and its bytes counted: what a
Collector receives, stores and, with tail sampling, holds in memory per step.

    VPY=$(scripts/engine-env vllm)/bin/python
    $VPY benchmarks/bench_sampling.py --out /tmp/sampling.json
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from typing import Any

import _common as C


class CountingExporter:
    """Counts spans and their OTLP/protobuf bytes (the OTLP exporters' own encoding), in export
    requests of 512 spans as the SDK's BatchSpanProcessor sends them by default."""

    BATCH = 512

    def __init__(self) -> None:
        self.held: list[Any] = []
        self.spans = 0
        self.request_spans = 0
        self.bytes = 0

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.held.extend(spans)
        return SpanExportResult.SUCCESS

    def count(self) -> None:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        spans, self.held = self.held, []
        self.spans += len(spans)
        self.request_spans += sum(1 for s in spans if s.name != "rollout.step")
        for i in range(0, len(spans), self.BATCH):
            self.bytes += len(encode_spans(spans[i : i + self.BATCH]).SerializeToString())

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _records(model: str, n: int, seed: int) -> list[Any]:
    from testkit.records import make_record

    rng = random.Random(seed)
    t0 = time.time_ns()
    out = []
    for i in range(n):
        latency = int(rng.paretovariate(1.5) * 1e9)
        out.append(
            make_record(
                model,
                request_id=f"r{i}",
                arrival_ns=t0,
                scheduled_ns=t0 + 1_000,
                first_token_ns=t0 + 2_000,
                finish_ns=t0 + latency,
                finish_reasons=("length" if i % 100 == 0 else "stop",),
                output_tokens=rng.randint(16, 4096),
            )
        )
    return sorted(out, key=lambda r: r.finish_ns)


def one(n: int, rate: float) -> dict[str, Any]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from otel_rollout.config import load_config
    from otel_rollout.emitter import flush_all
    from otel_rollout.steps import StepScope
    from otel_rollout.telemetry import Telemetry

    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = load_config({"OTEL_ROLLOUT_SAMPLE_RATE": str(rate)}, warn=False)
    telemetry = Telemetry(
        "vllm",
        provider.get_tracer("bench"),
        MeterProvider().get_meter("bench"),
        config,
        tracer_provider=provider,
    )
    model = f"bench-{n}-{rate}"
    records = _records(model, n, seed=n)
    with StepScope(1, telemetry=telemetry, config=config):
        telemetry.requests_started(model, "text_completion", n)
        for r in records:
            telemetry.emit(r)
        flush_all(60.0)
    provider.shutdown()
    exporter.count()
    return {
        "requests": n,
        "request_spans": exporter.request_spans,
        "spans": exporter.spans,
        "otlp_bytes": exporter.bytes,
        "kept_share": round(exporter.request_spans / n, 4),
    }


def run(smoke: bool) -> dict[str, Any]:
    sizes = (1_000,) if smoke else (1_000, 10_000)
    result: dict[str, Any] = {"machine": C.machine()}
    for n in sizes:
        every, sampled = one(n, 1.0), one(n, 0.02)
        result[f"step_{n}"] = {
            "every_span": every,
            "sampled_0.02": sampled,
            "bytes_ratio": round(sampled["otlp_bytes"] / every["otlp_bytes"], 4),
            "bytes_per_1000_requests": {
                "every_span": round(every["otlp_bytes"] * 1000 / n),
                "sampled_0.02": round(sampled["otlp_bytes"] * 1000 / n),
            },
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    C.write(args.out, run(args.smoke))


if __name__ == "__main__":
    main()
