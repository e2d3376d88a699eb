"""The engine-neutral request record, and the one place where engine clocks become epoch time.

Engines report on mixed clocks: vLLM stamps arrival with ``time.time()`` but token events with
``time.monotonic()``; SGLang mixes wall-clock receive stamps with durations. OpenTelemetry wants
epoch nanoseconds. Adapters hand over whatever the engine gave them, tagged with its clock, and
:class:`Clock` converts it exactly once; nothing downstream ever sees a monotonic value.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field

from otel_rollout.versions import ENGINE, as_version

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"
FINISH_ERROR = "error"


class StreamClosedEarly(Exception):
    """The request's error when its consumer stopped reading (``break``, ``aclose``, dropped)."""


_FINISH_ALIASES = {
    "stop": FINISH_STOP,
    "eos": FINISH_STOP,
    "stop_sequence": FINISH_STOP,
    "matched_stop": FINISH_STOP,
    "length": FINISH_LENGTH,
    "max_tokens": FINISH_LENGTH,
    "abort": FINISH_ABORT,
    "aborted": FINISH_ABORT,
    "cancelled": FINISH_ABORT,
    "error": FINISH_ERROR,
}


def normalize_finish_reason(reason: object) -> str | None:
    """Map an engine's finish reason (a string, an enum, or SGLang's ``{"type": ...}``) to ours.

    Metrics carry the result as a label, so anything unknown collapses to ``other`` rather than
    leaking an unbounded value.
    """
    if reason is None:
        return None
    if isinstance(reason, dict):
        reason = reason.get("type")
        if reason is None:
            return None
    name = getattr(reason, "name", reason)
    return _FINISH_ALIASES.get(str(name).lower(), "other")


def _is_abort(error: BaseException) -> bool:
    """Cancellation and early close are the caller's decision, not an engine failure."""
    return isinstance(error, (StreamClosedEarly, GeneratorExit)) or (
        type(error).__name__ == "CancelledError"
    )


_HF_CACHE_PREFIX = "models--"


def model_label(name: object) -> str:
    """A served model name as a bounded label: the first of a list, a local path's last part.

    A path inside the Hugging Face cache (``…/models--Qwen--Qwen2.5-7B/snapshots/<commit>``, what
    ``snapshot_download`` returns and what verl is often given) is named by its repository id,
    ``Qwen/Qwen2.5-7B``: its last part is a commit hash that tells nobody which model it is. The
    cache spells ``/`` as ``--``, which a Hub repository id may not contain, so the reversal is exact.
    """
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return _label(str(name or "unknown"))


@functools.lru_cache(maxsize=256)
def _label(text: str) -> str:
    """:func:`model_label` of one name, remembered: it is asked once per request, and a process
    serves a handful of models (a path's parsing cost ~2 µs a request)."""
    if not os.path.isabs(text):
        return text
    parts = [p for p in text.replace(os.sep, "/").split("/") if p]
    for index in range(len(parts) - 1, -1, -1):
        part = parts[index]
        if part.startswith(_HF_CACHE_PREFIX) and len(part) > len(_HF_CACHE_PREFIX):
            return part[len(_HF_CACHE_PREFIX) :].replace("--", "/")
    return parts[-1] if parts else text


def trace_hex(trace_id: int) -> str | None:
    """A trace id as W3C/Tempo write it (32 hex digits); ``None`` for the invalid id 0."""
    return format(trace_id, "032x") if trace_id else None


def span_hex(span_id: int) -> str | None:
    """A span id as W3C/Tempo write it (16 hex digits); ``None`` for the invalid id 0."""
    return format(span_id, "016x") if span_id else None


class Clock:
    """Converts monotonic readings to epoch nanoseconds with one offset sampled at creation.

    Sampling the offset once per batch (rather than per value) keeps the relative timing of a
    batch's requests exact even if the wall clock is slewed meanwhile.
    """

    __slots__ = ("_offset_ns",)

    def __init__(self) -> None:
        wall = time.time_ns()
        mono = time.monotonic_ns()
        self._offset_ns = wall - mono

    def from_monotonic(self, seconds: float | None) -> int | None:
        if seconds is None:
            return None
        return int(seconds * 1e9) + self._offset_ns

    @staticmethod
    def from_wall(seconds: float | None) -> int | None:
        return None if seconds is None else int(seconds * 1e9)

    def now_ns(self) -> int:
        return time.monotonic_ns() + self._offset_ns


def _seconds(ns: int) -> float:
    """A non-negative span of nanoseconds in seconds: a comparison, not ``max()`` (read several
    times per request by its span and metric points)."""
    return ns / 1e9 if ns > 0 else 0.0


@dataclass(slots=True)
class RequestRecord:
    """Everything we know about one finished (or failed) generate request.

    Times are epoch nanoseconds. ``first_token_ns`` and ``scheduled_ns`` are optional because not
    every engine mode reports them; ``timing_source`` says whether the timeline is the engine's own
    (``engine``) or what the instrumentation observed at the engine's boundary (``observed``).
    """

    provider: str
    model: str
    operation: str
    arrival_ns: int
    finish_ns: int
    request_id: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reasons: tuple[str, ...] = ()
    scheduled_ns: int | None = None
    first_token_ns: int | None = None
    error: BaseException | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    timing_source: str = "engine"
    prompt_text: str | None = None
    completion_texts: tuple[str, ...] = field(default=())
    trace_id: int = 0
    """The request span's ids, set by the emitter; 0 until the span exists (W3C: invalid)."""
    span_id: int = 0
    preemptions: int | None = None
    """Times the engine preempted the request (its own count); ``None`` where not reported."""
    spec_draft_tokens: int | None = None
    """Speculative decoding: draft tokens proposed for the request; ``None`` where not reported."""
    spec_accepted_tokens: int | None = None
    """Of those, the draft tokens accepted."""
    kept: str | None = "all"
    """Why the request's span is made (:mod:`otel_rollout.sampling`), ``None``: sampled out
    (its metric points are recorded all the same, with no exemplar)."""
    weight_version: int | str | None = None
    """The weight version that generated the request (:mod:`otel_rollout.versions`): the
    engine's own label of its first output token where the engine reports one, else the version
    in effect when it arrived; ``None`` where no version was ever seen."""
    weight_version_source: str | None = None
    """Where ``weight_version`` comes from: ``engine``, ``named`` or ``counted``."""
    weight_versions: tuple[tuple[str, int], ...] = ()
    """The engine's own versions over the request's output tokens, in order: (version, output
    tokens it generated), summed over the request's samples. More than one: the weights
    changed mid-request (a partial rollout)."""
    step: int | None = None
    """The training step it was handed over in (its context's, looked up once at hand-over:
    the span, made later on the emitter's thread, carries it as ``rollout.step``)."""
    replica: str | None = None
    """The engine instance that served it (:mod:`otel_rollout.replicas`): set where the record
    is made, else by the hand-over to the process's own name."""

    def set_engine_versions(self, versions: tuple[tuple[str, int], ...]) -> None:
        """The engine's own versions over the request's output tokens
        (:func:`~otel_rollout.versions.token_versions`): the first is the request's version,
        source ``engine``. Empty: the engine said nothing, and nothing is set."""
        if versions:
            self.weight_versions = versions
            self.weight_version = as_version(versions[0][0])
            self.weight_version_source = ENGINE

    @property
    def trace_hex(self) -> str | None:
        return trace_hex(self.trace_id)

    @property
    def span_hex(self) -> str | None:
        return span_hex(self.span_id)

    @property
    def finish_reason(self) -> str | None:
        """The single reason used as a metric label: error wins, else the first choice's."""
        if self.error is not None:
            return FINISH_ABORT if _is_abort(self.error) else FINISH_ERROR
        return self.finish_reasons[0] if self.finish_reasons else None

    @property
    def duration_s(self) -> float:
        return _seconds(self.finish_ns - self.arrival_ns)

    @property
    def queue_time_s(self) -> float | None:
        if self.scheduled_ns is None:
            return None
        return _seconds(self.scheduled_ns - self.arrival_ns)

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_ns is None:
            return None
        return _seconds(self.first_token_ns - self.arrival_ns)

    @property
    def prefill_time_s(self) -> float | None:
        """Scheduled → first token: the prompt's prefill (and any recompute before the first
        token), where the engine stamped both ends."""
        if self.scheduled_ns is None or self.first_token_ns is None:
            return None
        return _seconds(self.first_token_ns - self.scheduled_ns)

    @property
    def decode_time_s(self) -> float | None:
        """First token → finish: decoding the response (preemptions in it included)."""
        if self.first_token_ns is None:
            return None
        return _seconds(self.finish_ns - self.first_token_ns)

    @property
    def tpot_s(self) -> float | None:
        """Decode time per token after the first; undefined for fewer than two tokens."""
        if self.first_token_ns is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return _seconds(self.finish_ns - self.first_token_ns) / (self.output_tokens - 1)


Interval = tuple[int, int]
"""``(start_ns, end_ns)``, epoch nanoseconds."""


@dataclass(frozen=True)
class TrajectoryRecord:
    """One ended agentic trajectory (:mod:`otel_rollout.trajectories`), as its step sees it.

    The intervals are kept, not only their sums, so the step picture can draw the trajectory's
    lane (its turns and tool calls) and a step log can be redrawn later. Ids identify its span.
    """

    agent: str
    start_ns: int
    end_ns: int
    status: str
    turns: tuple[Interval, ...]
    output_tokens: int
    tools: tuple[Interval, ...]
    scoring: tuple[Interval, ...]
    generation_s: float
    tool_s: float
    scoring_s: float
    waiting_s: float
    reward: float | None = None
    advantage: float | None = None
    trace_id: int = 0
    span_id: int = 0

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    @property
    def trace_hex(self) -> str | None:
        return trace_hex(self.trace_id)

    @property
    def span_hex(self) -> str | None:
        return span_hex(self.span_id)
