"""vLLM's stat-logger interface: the engine's own per-iteration figures, summed per training step.

vLLM calls every stat logger once per engine iteration with its ``SchedulerStats`` and
``IterationStats`` (running and waiting requests, KV-cache usage, prefix-cache queries and hits,
prompt and generated tokens, preemptions, finished requests). This class is handed to the engine
through its own ``stat_loggers`` argument (:func:`otel_rollout.vllm.adapter.engine_init_wrapper`),
and only to an engine whose stats are on: every ``AsyncLLM`` (stats on is its default), and the
offline ``LLMEngine`` from vLLM 0.12 (0.11's refuses stat loggers, so there it gets none).
It is not a ``vllm.stat_logger_plugins`` entry point: vLLM turns stats on for every ``AsyncLLM``
when one is installed, and observing must not change the engine.

It does nothing unless a training step is open in the process (:mod:`otel_rollout.engine_stats`):
then :func:`sample` translates the two stat objects (pure, tested without an engine) and the
sample is added to each open step's window. vLLM documents the stat classes as unstable; every
field is read with a default, and a failure is logged once and never reaches the engine.
"""

from __future__ import annotations

from typing import Any

from otel_rollout import engine_stats
from otel_rollout.guard import PROCESS
from otel_rollout.record import model_label, normalize_finish_reason

__all__ = ["RolloutStatLogger", "sample"]  # noqa: F822  # the class is made on first access


def sample(scheduler_stats: Any, iteration_stats: Any) -> engine_stats.EngineSample:
    """One iteration's figures from vLLM's stat objects (either may be ``None``)."""
    prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
    spec = getattr(scheduler_stats, "spec_decoding_stats", None)
    finished = getattr(iteration_stats, "finished_requests", None) or ()
    reasons = []
    for request in finished:
        reason = getattr(request, "finish_reason", None)
        name = getattr(reason, "name", reason)
        reasons.append(normalize_finish_reason(str(name).lower()) or "other")
    return engine_stats.EngineSample(
        running=int(getattr(scheduler_stats, "num_running_reqs", 0) or 0),
        waiting=int(getattr(scheduler_stats, "num_waiting_reqs", 0) or 0),
        kv_cache_usage=float(getattr(scheduler_stats, "kv_cache_usage", 0.0) or 0.0),
        prompt_tokens=int(getattr(iteration_stats, "num_prompt_tokens", 0) or 0),
        generation_tokens=int(getattr(iteration_stats, "num_generation_tokens", 0) or 0),
        preemptions=int(getattr(iteration_stats, "num_preempted_reqs", 0) or 0),
        prefix_queries=int(getattr(prefix, "queries", 0) or 0),
        prefix_hits=int(getattr(prefix, "hits", 0) or 0),
        finished=tuple(reasons),
        spec_draft_tokens=int(getattr(spec, "num_draft_tokens", 0) or 0),
        spec_accepted_tokens=int(getattr(spec, "num_accepted_tokens", 0) or 0),
    )


def _build() -> type:
    """The logger class, made on first use (an engine is being built, so vLLM is loaded): it
    must subclass vLLM's ``StatLoggerBase``, and importing this module must not import vLLM (our
    modules never load an engine by themselves)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class RolloutStatLogger(StatLoggerBase):  # type: ignore[misc]  # vLLM is untyped
        """One per engine (vLLM makes one per engine index); the model names its windows."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            config = getattr(vllm_config, "model_config", None)
            self.model = model_label(
                getattr(config, "served_model_name", None) or getattr(config, "model", None)
            )

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if not engine_stats.has_open_steps():
                return
            with PROCESS.guard("vllm stat logger"):
                engine_stats.record(self.model, sample(scheduler_stats, iteration_stats))

        def log_engine_initialized(self) -> None:
            pass

    return RolloutStatLogger


def __getattr__(name: str) -> Any:
    if name == "RolloutStatLogger":
        cls = globals()[name] = _build()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
