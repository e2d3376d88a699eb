"""OpenTelemetry for the rollout phase of RL training: per-request spans on vLLM and SGLang,
tied to training steps, with long-tail analytics and exemplars that lead to the slow request."""

from __future__ import annotations

from typing import Any

from otel_rollout.steps import StepStats, current_step, rollout_step

__all__ = ["SGLangInstrumentor", "StepStats", "VLLMInstrumentor", "current_step", "rollout_step"]
__version__ = "0.1.0.dev0"


def __getattr__(name: str) -> Any:
    # The instrumentors load on first use, so `import otel_rollout` stays cheap in Ray workers.
    if name == "VLLMInstrumentor":
        from otel_rollout.vllm import VLLMInstrumentor

        return VLLMInstrumentor
    if name == "SGLangInstrumentor":
        from otel_rollout.sglang import SGLangInstrumentor

        return SGLangInstrumentor
    raise AttributeError(f"module 'otel_rollout' has no attribute {name!r}")
