"""OpenTelemetry for the rollout phase of RL training: per-request spans on vLLM and SGLang,
tied to training steps, with long-tail analytics and exemplars that lead to the slow request."""

from __future__ import annotations

from typing import Any

from otel_rollout.analysis import StepStats
from otel_rollout.context import current_step
from otel_rollout.phases import rollout_phase
from otel_rollout.steps import rollout_step, set_step
from otel_rollout.version import __version__

__all__ = [
    "SGLangInstrumentor",
    "StepStats",
    "VLLMInstrumentor",
    "__version__",
    "current_step",
    "rollout_phase",
    "rollout_step",
    "set_step",
    "set_weight_version",
]


def __getattr__(name: str) -> Any:
    # The instrumentors load on first use, so `import otel_rollout` stays cheap in Ray workers.
    if name == "VLLMInstrumentor":
        from otel_rollout.vllm import VLLMInstrumentor

        return VLLMInstrumentor
    if name == "SGLangInstrumentor":
        from otel_rollout.sglang import SGLangInstrumentor

        return SGLangInstrumentor
    if name == "set_weight_version":
        from otel_rollout.engine_ops import set_weight_version

        return set_weight_version
    raise AttributeError(f"module 'otel_rollout' has no attribute {name!r}")
