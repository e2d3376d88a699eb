"""The engine's own per-iteration figures, summed over each open training step.

Engines count what happens inside them once per scheduler iteration: requests running and
waiting, KV-cache usage, prompt and generated tokens, preemptions, prefix-cache queries and hits.
They export these process-wide; nothing ties them to a training step. Here an engine's stat hook
(vLLM's stat-logger interface, :mod:`otel_rollout.vllm.stat_logger`) hands each iteration's
:class:`EngineSample` to :func:`record`, which adds it to the :class:`EngineWindow` of every step
open in the process; the step reads its window when it ends (:func:`close`). With no step open a
sample costs one truthiness check.

An engine whose figures live in another process, where no hook of ours runs (SGLang's scheduler:
:mod:`otel_rollout.sglang.scheduler_metrics`), registers a :data:`Poller` instead: it is read
when a step opens and when it ends (so counters' deltas are the step's), and once a second in
between while a step is open (gauges: their peak and mean over those samples). Such samples are
marked ``sampled``, and the step says so (``rollout.step.engine.source``).

Pure accounting, no OpenTelemetry: the step scope turns a window into span attributes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from otel_rollout.guard import PROCESS

POLL_S = 1.0
"""How often a poller is read while a step is open."""


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
    spec_draft_tokens: int = 0
    """Speculative decoding: draft tokens proposed in the iteration (0 where it is off)."""
    spec_accepted_tokens: int = 0
    sampled: bool = False
    """Read from the engine's own metrics at a moment (a :data:`Poller`), not one iteration:
    its counts are the deltas since the previous read, its gauges their value then."""


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
    sampled: bool = False
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    def add(self, s: EngineSample) -> None:
        self.iterations += 1
        self.sampled = self.sampled or s.sampled
        self.running_peak = max(self.running_peak, s.running)
        self.waiting_peak = max(self.waiting_peak, s.waiting)
        self.kv_cache_usage_peak = max(self.kv_cache_usage_peak, s.kv_cache_usage)
        self.kv_cache_usage_sum += s.kv_cache_usage
        self.prompt_tokens += s.prompt_tokens
        self.generation_tokens += s.generation_tokens
        self.preemptions += s.preemptions
        self.prefix_queries += s.prefix_queries
        self.prefix_hits += s.prefix_hits
        self.spec_draft_tokens += s.spec_draft_tokens
        self.spec_accepted_tokens += s.spec_accepted_tokens
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
            self.sampled or other.sampled,
            self.spec_draft_tokens + other.spec_draft_tokens,
            self.spec_accepted_tokens + other.spec_accepted_tokens,
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


Poller = Callable[[], bool]
"""Reads one engine's figures and :func:`record`-s the change since its previous read; returns
False once the engine is gone (it is then dropped). A failure is logged once, never raised."""
_POLLERS: dict[Hashable, Poller] = {}
_POLL_THREAD: threading.Thread | None = None


def add_poller(key: Hashable, poller: Poller) -> None:
    """Register an engine's poller (a later one under the same key replaces it) and read it once:
    that read is its baseline."""
    global _POLL_THREAD
    with _LOCK:
        _POLLERS[key] = poller
        if _POLL_THREAD is None or not _POLL_THREAD.is_alive():  # first, or after a fork
            _POLL_THREAD = threading.Thread(
                target=_poll_forever, name="otel-rollout-engine-poll", daemon=True
            )
            _POLL_THREAD.start()
    with PROCESS.guard("engine figures poll"):
        poller()


def poll() -> None:
    """Read every poller now (a step opens or ends, or the second has passed)."""
    for key, poller in list(_POLLERS.items()):
        alive = True
        with PROCESS.guard("engine figures poll"):
            alive = poller()
        if not alive:
            with _LOCK:
                if _POLLERS.get(key) is poller:
                    del _POLLERS[key]


def _poll_forever() -> None:
    """The once-a-second read (a daemon thread, started with the first poller, for good)."""
    while True:
        time.sleep(POLL_S)
        if _OPEN and _POLLERS:
            poll()


def open_window(key: int) -> None:
    """A step opened: the iterations of every engine of the process count for it from now."""
    if _POLLERS:
        poll()  # what the pollers' engines did before now belongs to the steps already open
    with _LOCK:
        _OPEN[key] = {}


def close(key: int) -> dict[str, EngineWindow]:
    """A step ended: its windows, one per engine that reported an iteration during it."""
    if _POLLERS:
        poll()  # and what they did until now belongs to this one too
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
