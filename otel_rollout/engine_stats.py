"""The engine's own per-iteration figures, summed over each open training step.

Engines count what happens inside them once per scheduler iteration: requests running and
waiting, KV-cache usage, prompt and generated tokens, preemptions, prefix-cache queries and hits.
They export these process-wide; nothing ties them to a training step. Here an engine's stat hook
(vLLM's stat-logger interface, :mod:`otel_rollout.vllm.stat_logger`) hands each iteration's
:class:`EngineSample` to :func:`record`, which adds it to the :class:`EngineWindow` of every step
open in the process; the step reads its window when it ends (:func:`close`). With no step open a
sample costs one truthiness check.

Pure accounting, no OpenTelemetry: the step scope turns a window into span attributes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One scheduler iteration as the engine counted it (``None``: not reported)."""

    running: int
    waiting: int
    kv_cache_usage: float
    """0–1: the share of KV-cache blocks in use after the iteration."""
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    prefix_queries: int
    """Prompt tokens looked up in the prefix cache in this iteration."""
    prefix_hits: int
    finished: tuple[str, ...] = ()
    """The finish reason of each request that finished in the iteration."""


@dataclass
class EngineWindow:
    """Σ and peaks of the iterations of one engine during one step."""

    iterations: int = 0
    running_peak: int = 0
    waiting_peak: int = 0
    kv_cache_usage_peak: float = 0.0
    kv_cache_usage_sum: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    finished: dict[str, int] = field(default_factory=dict)

    def add(self, s: EngineSample) -> None:
        self.iterations += 1
        self.running_peak = max(self.running_peak, s.running)
        self.waiting_peak = max(self.waiting_peak, s.waiting)
        self.kv_cache_usage_peak = max(self.kv_cache_usage_peak, s.kv_cache_usage)
        self.kv_cache_usage_sum += s.kv_cache_usage
        self.prompt_tokens += s.prompt_tokens
        self.generation_tokens += s.generation_tokens
        self.preemptions += s.preemptions
        self.prefix_queries += s.prefix_queries
        self.prefix_hits += s.prefix_hits
        for reason in s.finished:
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def merge(self, other: EngineWindow) -> EngineWindow:
        """Two engines' windows as one (the process's view of the step): Σ and max."""
        finished = dict(self.finished)
        for reason, count in other.finished.items():
            finished[reason] = finished.get(reason, 0) + count
        return EngineWindow(
            self.iterations + other.iterations,
            max(self.running_peak, other.running_peak),
            max(self.waiting_peak, other.waiting_peak),
            max(self.kv_cache_usage_peak, other.kv_cache_usage_peak),
            self.kv_cache_usage_sum + other.kv_cache_usage_sum,
            self.prompt_tokens + other.prompt_tokens,
            self.generation_tokens + other.generation_tokens,
            self.preemptions + other.preemptions,
            self.prefix_queries + other.prefix_queries,
            self.prefix_hits + other.prefix_hits,
            finished,
        )

    @property
    def kv_cache_usage_mean(self) -> float:
        """Mean over the step's iterations (each engine step weighs the same)."""
        return self.kv_cache_usage_sum / self.iterations if self.iterations else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None


_OPEN: dict[int, dict[str, EngineWindow]] = {}
"""Open step (by id) → engine (model) → its window."""
_LOCK = threading.Lock()


def open_window(key: int) -> None:
    """A step opened: the iterations of every engine of the process count for it from now."""
    with _LOCK:
        _OPEN[key] = {}


def close(key: int) -> dict[str, EngineWindow]:
    """A step ended: its windows, one per engine that reported an iteration during it."""
    with _LOCK:
        return _OPEN.pop(key, {})


def has_open_steps() -> bool:
    """The hot path's check: an engine hook translates nothing while no step is open."""
    return bool(_OPEN)


def record(model: str, sample: EngineSample) -> None:
    """An engine iteration: added to the window of each open step."""
    if not _OPEN:
        return
    with _LOCK:
        for windows in _OPEN.values():
            window = windows.get(model)
            if window is None:
                window = windows[model] = EngineWindow()
            window.add(sample)
