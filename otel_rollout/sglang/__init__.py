"""``SGLangInstrumentor``: the wrap/unwrap pairs for SGLang; the translation lives in ``adapter``."""

from __future__ import annotations

from otel_rollout import engine_ops as ops
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
    # 0.4.9 (verl's oldest image): every wrapped target has the shape the adapter expects
    # (tests/compat/test_sglang_contract.py, against the released wheels); its figures are
    # fewer, and labelled (docs/ENGINES.md).
    min_version = (0, 4, 9)
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
            *self._operations(telemetry),
        ]

    @staticmethod
    def _operations(telemetry: Telemetry) -> list[Target]:
        """Weight sync, memory release / resume and pause / continue
        (:mod:`otel_rollout.engine_ops`): ``TokenizerManager``'s coroutines, which both the
        offline ``Engine`` and the HTTP server (``/update_weights_from_disk``, …) call."""
        manager = "sglang.srt.managers.tokenizer_manager"
        # Each update request may name the version it loads (``obj.weight_version``).
        weights = ops.WEIGHT_SYNC.named(ops.version_field(0, "weight_version"))
        plan: list[tuple[str, ops.EngineOp, bool]] = [
            ("update_weights_from_disk", weights, False),
            ("update_weights_from_tensor", weights, False),
            ("update_weights_from_distributed", weights, False),
            ("release_memory_occupation", ops.ENGINE_SLEEP, False),
            ("resume_memory_occupation", ops.ENGINE_WAKE, False),
            ("pause_generation", ops.GENERATION_PAUSE, False),
            ("continue_generation", ops.GENERATION_RESUME, False),
            ("update_weights_from_ipc", weights, True),  # checkpoint-engine, newer only
        ]
        return [
            *(
                Target(
                    manager,
                    f"TokenizerManager.{method}",
                    ops.operation_wrapper(
                        telemetry, op, f"TokenizerManager.{method}", adapter.model_name
                    ),
                    optional=optional,
                )
                for method, op, optional in plan
            ),
            # Names the weights' version without loading any (``/update_weight_version``).
            Target(
                manager,
                "TokenizerManager.update_weight_version",
                ops.version_name_wrapper(
                    telemetry, ops.version_field(0, "new_version"), adapter.model_name
                ),
                optional=True,
            ),
        ]
