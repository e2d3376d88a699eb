"""A process with no global OpenTelemetry providers: the instrumentor is given its own.

Run by test_explicit_providers.py. Prints one JSON line: what reached the given providers and
whether anything was installed globally.
"""

from __future__ import annotations

import json
import sys

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_rollout import VLLMInstrumentor, rollout_step
from testkit.engines import VLLM_KWARGS, vllm_environment


def main(model: str) -> None:
    vllm_environment()
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    VLLMInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)

    import vllm

    llm = vllm.LLM(model=model, **VLLM_KWARGS)
    lengths = [3, 5, 7, 9]
    with rollout_step(5) as scope:
        llm.generate(
            [f"p{i}" for i in range(len(lengths))],
            [vllm.SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths],
        )
    points: dict[str, int] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points[m.name] = points.get(m.name, 0) + sum(
                    getattr(p, "count", 0) for p in m.data.data_points
                )
    finished = spans.get_finished_spans()
    print(
        json.dumps(
            {
                "spans": sorted(s.name for s in finished),
                "step_requests": [
                    s.attributes.get("rollout.step.requests")
                    for s in finished
                    if s.name == "rollout.step"
                ],
                "request_steps": sorted(
                    {
                        s.attributes.get("rollout.step")
                        for s in finished
                        if s.attributes.get("gen_ai.usage.output_tokens") is not None
                    }
                ),
                "points": points,
                "stats_requests": scope.stats.requests if scope.stats else None,
                "global_tracer_provider": type(trace.get_tracer_provider()).__name__,
                "global_meter_provider": type(metrics.get_meter_provider()).__name__,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
