"""A rollout actor as verl lays it out: its own vLLM engine, called from the driver with .remote().

Kept in its own module (not the test file) so Ray workers import it by name rather than
unpickling a test module's closure.
"""

from __future__ import annotations

import os
from typing import Any

from otel_rollout.ray import force_flush, receives_context, setup_worker


class RolloutActor:
    def __init__(self, model: str, engine_kwargs: dict[str, Any]) -> None:
        setup_worker()  # idempotent; the job's worker_process_setup_hook already ran it
        import vllm

        self.vllm = vllm
        self.llm = vllm.LLM(model=model, **engine_kwargs)

    def describe(self) -> dict[str, Any]:
        from opentelemetry import trace

        from otel_rollout.vllm import VLLMInstrumentor

        return {
            "pid": os.getpid(),
            "tracer_provider": type(trace.get_tracer_provider()).__name__,
            "instrumented": VLLMInstrumentor().is_instrumented_by_opentelemetry,
            "endpoint": os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        }

    @receives_context
    def generate(self, lengths: list[int], tag: str) -> list[int]:
        params = [self.vllm.SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
        outs = self.llm.generate([f"{tag} {i}" for i in range(len(lengths))], params)
        return [len(o.outputs[0].token_ids) for o in outs]

    def flush(self) -> bool:
        return force_flush()
