"""vLLM's own tracing next to ours, in a process of its own (vLLM installs a global provider).

``--user-provider``: the user set up the SDK first; an AsyncLLM with ``otlp_traces_endpoint``
serves one request inside a caller span. Without it: nobody set a provider, and an offline LLM
with tracing on installs vLLM's own — which we must say, once.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from opentelemetry import trace

from testkit.engines import VLLM_KWARGS, vllm_environment


async def traced_request(model: str, endpoint: str) -> str:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=model, otlp_traces_endpoint=endpoint, **VLLM_KWARGS)
    )
    with trace.get_tracer("job").start_as_current_span("caller") as caller:
        async for _ in engine.generate("hello", SamplingParams(max_tokens=3), "traced"):
            pass
    engine.shutdown()
    return format(caller.get_span_context().trace_id, "032x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--user-provider", action="store_true")
    args = parser.parse_args()
    vllm_environment()
    if args.user_provider:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=args.endpoint, insecure=True))
        )
        trace.set_tracer_provider(provider)
    from otel_rollout import VLLMInstrumentor

    VLLMInstrumentor().instrument()
    if args.user_provider:
        print(
            json.dumps({"caller_trace_id": asyncio.run(traced_request(args.model, args.endpoint))})
        )
        trace.get_tracer_provider().force_flush()
    else:
        import vllm

        vllm.LLM(model=args.model, otlp_traces_endpoint=args.endpoint, **VLLM_KWARGS)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
