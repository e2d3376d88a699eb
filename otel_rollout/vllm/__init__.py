"""``VLLMInstrumentor``: the wrap/unwrap pairs for vLLM; the translation lives in ``adapter``."""

from __future__ import annotations

from otel_rollout.instrumentation import (
    EngineInstrumentor,
    Target,
    watch_global_tracer_provider,
)
from otel_rollout.telemetry import Telemetry
from otel_rollout.vllm import adapter

__all__ = ["VLLMInstrumentor"]


class VLLMInstrumentor(EngineInstrumentor):
    """Spans and metrics for every request vLLM serves in this process (offline and async)."""

    engine_module = "vllm"
    engine_name = "vLLM"
    provider = adapter.PROVIDER
    min_version = (0, 10)
    max_tested = (0, 32, 0)

    def targets(self, telemetry: Telemetry) -> list[Target]:
        watch = watch_global_tracer_provider(self.engine_name)
        processor = "vllm.v1.engine.output_processor"
        serving, get_trace_headers = adapter.serving_hook()
        return [
            Target(
                "vllm.entrypoints.llm",
                "LLM.generate",
                adapter.offline_wrapper(telemetry, "text_completion"),
            ),
            Target("vllm.entrypoints.llm", "LLM.chat", adapter.offline_wrapper(telemetry, "chat")),
            Target(
                processor, "OutputProcessor.add_request", adapter.add_request_wrapper(telemetry)
            ),
            Target(
                processor,
                "OutputProcessor.process_outputs",
                adapter.process_outputs_wrapper(telemetry),
            ),
            Target(
                "vllm.v1.engine.async_llm",
                "AsyncLLM.generate",
                adapter.async_generate_wrapper(telemetry),
            ),
            # The OpenAI server: every endpoint reads the HTTP headers here before the engine call.
            Target(serving, get_trace_headers, adapter.server_headers_wrapper(telemetry)),
            Target("vllm.v1.engine.async_llm", "AsyncLLM.__init__", watch),
            Target("vllm.v1.engine.llm_engine", "LLMEngine.__init__", watch),
        ]
