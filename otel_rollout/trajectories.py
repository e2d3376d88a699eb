"""Agentic trajectories: one sample's turns, tool calls and reward as one span.

In agentic RL one sample is a conversation of several engine requests (turns), tool calls and a
reward computation; the tail of a step is as often a slow tool or a long conversation as a long
answer. A trajectory is

* a span under the current step, ``invoke_agent <agent>`` (the GenAI agent conventions:
  ``gen_ai.operation.name=invoke_agent``, ``gen_ai.agent.name``), over every engine request
  finished in its context (their spans are its children: the context is the trajectory's), its
  tool calls (``execute_tool <tool>`` spans, :func:`rollout_tool`) and its scoring
  (``rollout.scoring``, :func:`rollout_scoring`);
* on that span: turns, generated tokens, seconds in generation / tools / scoring / neither
  (``waiting``), the reward and advantage when given, how it ended, and the sample and group ids
  — span attributes only, never metric labels;
* a point of ``rollout.trajectory.duration`` and of ``rollout.trajectory.turns``, labelled with
  the (bounded) status, recorded in the span's context: exemplars lead to the trajectory.

Requests are counted where their records are handed over (:func:`otel_rollout.context.
collectors`), in the process that opened the trajectory: engines in the same process (vLLM
``LLM``/``AsyncLLM``, SGLang's ``Engine``) and HTTP-client requests. A trajectory never changes
what it wraps: exceptions pass through (the span records them), our failures are logged once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as GenAI
from opentelemetry.trace import SpanKind

from otel_rollout.attributes import trajectory_span_attributes
from otel_rollout.context import StepCollector, current_step, step_number, with_trajectory
from otel_rollout.decorating import each_call_in
from otel_rollout.instruments import TrajectoryInstruments
from otel_rollout.record import TrajectoryRecord
from otel_rollout.semconv import (
    ROLLOUT_STEP,
    SCORING_SPAN_NAME,
    TRAJECTORY_GROUP_ID,
    TRAJECTORY_SAMPLE_ID,
    TRAJECTORY_STATUS,
)
from otel_rollout.telemetry import StepTelemetry, job_step_telemetry, mark_error

if TYPE_CHECKING:
    from otel_rollout.record import RequestRecord

__all__ = ["STATUSES", "TrajectoryScope", "rollout_scoring", "rollout_tool", "rollout_trajectory"]

F = TypeVar("F", bound=Callable[..., Any])
STATUSES = ("completed", "truncated", "aborted", "stale_dropped", "error")
"""How a trajectory ends (the one metric label): anything else is recorded as ``other``."""
ENGINE_TIMED, CLIENT_TIMED = "engine_request", "client_call"
"""Values of ``rollout.trajectory.turn_timing`` (:data:`otel_rollout.semconv.TRAJECTORY_TURN_TIMING`)."""
_TRAJECTORY_KEY = otel_context.create_key("otel_rollout.trajectory_scope")
_instruments: dict[int, TrajectoryInstruments] = {}
_instruments_lock = threading.Lock()


def _instruments_of(telemetry: StepTelemetry) -> TrajectoryInstruments:
    with _instruments_lock:
        made = _instruments.get(id(telemetry))
        if made is None:
            made = _instruments[id(telemetry)] = TrajectoryInstruments(
                telemetry.meter, telemetry.config
            )
        return made


def union_seconds(intervals: Iterable[tuple[int, int]]) -> float:
    """Seconds covered by at least one of the ``(start_ns, end_ns)`` intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += max(0, end - start)
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total / 1e9


class TrajectoryScope:
    """``with rollout_trajectory(sample_id=…) as t:`` / ``async with`` / ``@rollout_trajectory()``."""

    def __init__(
        self,
        agent: str = "rollout",
        *,
        sample_id: str | int | None = None,
        group_id: str | int | None = None,
        telemetry: StepTelemetry | None = None,
        **attributes: Any,
    ) -> None:
        self.agent = agent
        self.attributes: dict[str, Any] = {
            k if k.startswith(("rollout.", "gen_ai.")) else f"rollout.trajectory.{k}": v
            for k, v in attributes.items()
        }
        if sample_id is not None:
            self.attributes[TRAJECTORY_SAMPLE_ID] = str(sample_id)
        if group_id is not None:
            self.attributes[TRAJECTORY_GROUP_ID] = str(group_id)
        self.step: int | None = None
        self.status: str | None = None
        self.reward: float | None = None
        self.advantage: float | None = None
        self._given = telemetry
        self._telemetry: StepTelemetry | None = None
        self._lock = threading.Lock()
        self._turns: list[tuple[int, int, int | None]] = []
        self._turn_timing: set[str] = set()
        self._activities: dict[str, list[tuple[int, int]]] = {"tool": [], "scoring": []}
        self._span: trace.Span | None = None
        self._token: object | None = None
        self._step_scope: StepCollector | None = None
        self._start_ns = 0
        self.duration_s: float | None = None
        """The trajectory's wall time once it ended."""

    # --- what the loop tells us ---------------------------------------------------------------

    def set_reward(self, reward: float, advantage: float | None = None) -> None:
        self.reward = float(reward)
        if advantage is not None:
            self.advantage = float(advantage)

    def set_status(self, status: str) -> None:
        """``completed``, ``truncated``, ``aborted``, ``stale_dropped`` (see :data:`STATUSES`)."""
        self.status = status

    # --- what we observe ----------------------------------------------------------------------

    def observe(self, record: RequestRecord) -> None:
        """A turn: an engine request that finished in the trajectory's context."""
        self.observe_turn(record.arrival_ns, record.finish_ns, record.output_tokens, ENGINE_TIMED)

    def observe_turn(
        self, start_ns: int, end_ns: int, output_tokens: int | None, timing: str = CLIENT_TIMED
    ) -> None:
        """A turn timed by the loop's client (its engine is in another process: verl's)."""
        with self._lock:
            self._turns.append((start_ns, end_ns, output_tokens))
            self._turn_timing.add(timing)

    def add_activity(self, kind: str, start_ns: int, end_ns: int) -> None:
        with self._lock:
            self._activities[kind].append((start_ns, end_ns))

    @property
    def turns(self) -> int:
        return len(self._turns)

    def record(self, end_ns: int) -> TrajectoryRecord:
        """The trajectory as it stands at ``end_ns`` (pure arithmetic over what was observed)."""
        with self._lock:
            turns = list(self._turns)
            tools = list(self._activities["tool"])
            scoring = list(self._activities["scoring"])

        def inside(intervals: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
            # an engine may stamp a turn's arrival before our clock saw the trajectory open
            return tuple((max(a, self._start_ns), min(f, end_ns)) for a, f in intervals)

        generation = inside((a, f) for a, f, _ in turns)
        tools_in, scoring_in = inside(tools), inside(scoring)
        duration = max(0, end_ns - self._start_ns) / 1e9
        busy = union_seconds([*generation, *tools_in, *scoring_in])
        span_context = self._span.get_span_context() if self._span is not None else None
        return TrajectoryRecord(
            agent=self.agent,
            start_ns=self._start_ns,
            end_ns=end_ns,
            status=self.status or "completed",
            turns=generation,
            output_tokens=sum(t or 0 for _, _, t in turns),
            tools=tools_in,
            scoring=scoring_in,
            generation_s=union_seconds(generation),
            tool_s=union_seconds(tools_in),
            scoring_s=union_seconds(scoring_in),
            waiting_s=max(0.0, duration - busy),
            reward=self.reward,
            advantage=self.advantage,
            trace_id=span_context.trace_id if span_context is not None else 0,
            span_id=span_context.span_id if span_context is not None else 0,
        )

    # --- scope --------------------------------------------------------------------------------

    def __enter__(self) -> TrajectoryScope:
        telemetry = self._telemetry = self._given or job_step_telemetry()
        ctx = otel_context.get_current()
        self.step = step_number(ctx)
        self._step_scope = current_step(ctx)
        self._start_ns = time.time_ns()
        attrs = {
            **self.attributes,
            GenAI.GEN_AI_OPERATION_NAME: GenAI.GenAiOperationNameValues.INVOKE_AGENT.value,
            GenAI.GEN_AI_AGENT_NAME: self.agent,
        }
        if self.step is not None:
            attrs[ROLLOUT_STEP] = self.step
        with telemetry.log.guard("trajectory span"):
            self._span = telemetry.tracer.start_span(
                f"invoke_agent {self.agent}",
                kind=SpanKind.INTERNAL,
                attributes=attrs,
                start_time=self._start_ns,
            )
            ctx = trace.set_span_in_context(self._span, ctx)
        ctx = otel_context.set_value(_TRAJECTORY_KEY, self, with_trajectory(self, ctx))
        self._token = otel_context.attach(ctx)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        end_ns = time.time_ns()
        self.duration_s = max(0, end_ns - self._start_ns) / 1e9
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        if self.status is None:
            self.status = "error" if exc is not None else "completed"
        telemetry = self._telemetry or job_step_telemetry()
        span = self._span
        if span is None:
            return
        try:
            with telemetry.log.guard("trajectory telemetry"):
                record = self.record(end_ns)
                span.set_attributes(trajectory_span_attributes(record, self._turn_timing))
                if exc is not None:
                    mark_error(span, exc)
                label = {TRAJECTORY_STATUS: self.status if self.status in STATUSES else "other"}
                _instruments_of(telemetry).record(
                    self.duration_s, len(record.turns), label, trace.set_span_in_context(span)
                )
                if self._step_scope is not None:
                    self._step_scope.observe_trajectory(record)
        finally:
            self._span = None
            with telemetry.log.guard("trajectory span"):
                span.end(end_time=end_ns)

    async def __aenter__(self) -> TrajectoryScope:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, func: F) -> F:
        """As a decorator every call is one trajectory."""
        template = self

        def scope() -> TrajectoryScope:
            return TrajectoryScope(template.agent, telemetry=template._given, **template.attributes)

        return each_call_in(func, scope)


class _Activity:
    """A tool call or the scoring of the current trajectory: a child span, its seconds counted."""

    def __init__(self, kind: str, name: str, attributes: dict[str, Any]) -> None:
        self.kind, self.name, self.attributes = kind, name, attributes
        self._trajectory: TrajectoryScope | None = None
        self._span: trace.Span | None = None
        self._token: object | None = None
        self._start_ns = 0

    def __enter__(self) -> _Activity:
        ctx = otel_context.get_current()
        self._trajectory = otel_context.get_value(_TRAJECTORY_KEY, ctx)  # type: ignore[assignment]
        telemetry = (
            job_step_telemetry()
            if self._trajectory is None
            else (self._trajectory._telemetry or job_step_telemetry())
        )
        self._start_ns = time.time_ns()
        with telemetry.log.guard("tool span"):
            self._span = telemetry.tracer.start_span(
                self.name,
                kind=SpanKind.INTERNAL,
                attributes=self.attributes,
                start_time=self._start_ns,
            )
            self._token = otel_context.attach(trace.set_span_in_context(self._span, ctx))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        end_ns = time.time_ns()
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        if self._trajectory is not None:
            self._trajectory.add_activity(self.kind, self._start_ns, end_ns)
        span, self._span = self._span, None
        if span is not None:
            if exc is not None:
                mark_error(span, exc)
            span.end(end_time=end_ns)

    async def __aenter__(self) -> _Activity:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, func: F) -> F:
        template = self
        return each_call_in(
            func, lambda: _Activity(template.kind, template.name, template.attributes)
        )


def rollout_trajectory(
    agent: str = "rollout",
    *,
    sample_id: str | int | None = None,
    group_id: str | int | None = None,
    **attributes: Any,
) -> TrajectoryScope:
    """Open one sample's trajectory under the current step: a context manager (sync or async)
    and a decorator. ``sample_id`` / ``group_id`` go on the span only."""
    return TrajectoryScope(agent, sample_id=sample_id, group_id=group_id, **attributes)


def rollout_tool(name: str, call_id: str | None = None) -> _Activity:
    """A tool call of the current trajectory: an ``execute_tool <name>`` span (GenAI conventions)
    whose seconds count as the trajectory's tool time. Its input and output are content: not
    recorded."""
    attrs: dict[str, Any] = {
        GenAI.GEN_AI_OPERATION_NAME: GenAI.GenAiOperationNameValues.EXECUTE_TOOL.value,
        GenAI.GEN_AI_TOOL_NAME: name,
    }
    if call_id is not None:
        attrs[GenAI.GEN_AI_TOOL_CALL_ID] = call_id
    return _Activity("tool", f"execute_tool {name}", attrs)


def rollout_scoring() -> _Activity:
    """The reward computation of the current trajectory: a ``rollout.scoring`` span whose
    seconds count as the trajectory's scoring time."""
    return _Activity("scoring", SCORING_SPAN_NAME, {})
