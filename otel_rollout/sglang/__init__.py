"""``SGLangInstrumentor``: the wrap/unwrap pairs for SGLang; the translation lives in ``adapter``."""

from __future__ import annotations

from otel_rollout.instrumentation import (
    EngineInstrumentor,
    Target,
    watch_global_tracer_provider,
)
from otel_rollout.sglang import adapter
from otel_rollout.telemetry import Telemetry

__all__ = ["SGLangInstrumentor"]


class SGLangInstrumentor(EngineInstrumentor):
    """Spans and metrics for every generate request SGLang serves in this process."""

    engine_module = "sglang"
    engine_name = "SGLang"
    provider = adapter.PROVIDER
    min_version = (0, 5)
    max_tested = (0, 5, 23)

    def targets(self, telemetry: Telemetry) -> list[Target]:
        engine = "sglang.srt.entrypoints.engine"
        manager = "sglang.srt.managers.tokenizer_manager"
        return [
            # Also where the HTTP server's request headers (traceparent, baggage) are read.
            Target(
                manager,
                "TokenizerManager.generate_request",
                adapter.generate_request_wrapper(telemetry),
            ),
            Target(engine, "Engine.generate", adapter.engine_wrapper),
            Target(engine, "Engine.async_generate", adapter.async_engine_wrapper),
            Target(engine, "Engine.__init__", watch_global_tracer_provider(self.engine_name)),
        ]
