"""Engine operations that are not generation: weight sync, sleep and wake-up, pause and resume.

Between two rollouts an RL trainer updates the engine's weights (often 10–80 s a step at scale),
puts a colocated engine to sleep while the trainer uses the GPU, and pauses generation around
the update. Those calls are the engines' own API (vLLM's ``LLM``/``AsyncLLM``, SGLang's
``TokenizerManager``), so they are wrapped here, zero-code, from each engine's ``targets()``:

* each call is a **phase** of the current step (:class:`~otel_rollout.phases.PhaseScope`) named by
  its kind (:data:`KINDS`, the vocabulary verl's ``update_weights`` timer also maps to), on the
  engine's own tracer (its scope names the engine instrumentation), with the engine's method as
  ``rollout.phase.framework_name``; its seconds are a point of ``rollout.step.phase.duration``
  labelled with the kind, and a call directly under a step adds to the step's phase totals;
* while it runs the engine is **held** (:class:`~otel_rollout.activity.EngineActivity`): neither
  busy nor idle; sleep and pause leave it held (``asleep``, ``paused``) until the wake-up or
  resume call, so ``rollout.engine.idle_time`` only counts time the engine could have generated.

A call inside another wrapped call (``AsyncLLM.update_weights`` reaching ``collective_rpc``) is
the outer one's business: it is not counted twice. The engine's result and exceptions pass
through untouched; a failure of ours is logged once and the call runs unobserved.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, NamedTuple

from otel_rollout.activity import EngineActivity
from otel_rollout.attributes import engine_attributes
from otel_rollout.instrumentation import Wrapper, argument, observing, should_observe
from otel_rollout.phases import PhaseScope
from otel_rollout.telemetry import Telemetry

__all__ = [
    "ENGINE_SLEEP",
    "ENGINE_WAKE",
    "GENERATION_PAUSE",
    "GENERATION_RESUME",
    "KINDS",
    "WEIGHT_SYNC",
    "Classifier",
    "EngineOp",
    "operation_wrapper",
    "weight_rpc",
]


class EngineOp(NamedTuple):
    """One kind of engine operation: its phase name, and the lasting state it sets or clears."""

    kind: str
    enters: str | None = None
    """State the engine is in once the call returned (``asleep``), until a call leaves it."""
    leaves: str | None = None
    """State a successful call ends (a wake-up ends ``asleep``), unless it returned ``False``:
    vLLM's ``wake_up(tags=…)`` returns whether the engine is fully awake."""


WEIGHT_SYNC = EngineOp("weight_sync")
ENGINE_SLEEP = EngineOp("engine_sleep", enters="asleep")
ENGINE_WAKE = EngineOp("engine_wake", leaves="asleep")
GENERATION_PAUSE = EngineOp("generation_pause", enters="paused")
GENERATION_RESUME = EngineOp("generation_resume", leaves="paused")
KINDS = tuple(
    op.kind for op in (WEIGHT_SYNC, ENGINE_SLEEP, ENGINE_WAKE, GENERATION_PAUSE, GENERATION_RESUME)
)
"""The phase names engine operations use: a bounded label set, shared by both engines."""

Classifier = Callable[[tuple[Any, ...], dict[str, Any]], "tuple[EngineOp, str] | None"]
"""For a generic entry point (``collective_rpc``): the call's kind and name, or ``None`` when
the call is not an operation we time (it then runs unobserved)."""


def weight_rpc(owner: str) -> Classifier:
    """vLLM's ``collective_rpc(method, …)``: a weight sync when the method's name says weights.

    RL frameworks reload or receive weights through worker RPCs of their own naming
    (``reload_weights``, verl's ``update_weights_from_ipc``, ``update_weights``); every other RPC
    (``get_model``, metrics, …) is none of our business and runs unobserved.
    """

    def classify(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[EngineOp, str] | None:
        method = argument(args, kwargs, 0, "method")
        name = method if isinstance(method, str) else getattr(method, "__name__", "")
        if not isinstance(name, str) or "weight" not in name.lower():
            return None
        return WEIGHT_SYNC, f"{owner}.collective_rpc:{name}"

    return classify


class _Running:
    """One operation in progress: the engine held, its phase open (a sync context manager)."""

    __slots__ = ("op", "activity", "scope", "telemetry", "result")

    def __init__(
        self, op: EngineOp, activity: EngineActivity, scope: PhaseScope, telemetry: Telemetry
    ) -> None:
        self.op = op
        self.activity = activity
        self.scope = scope
        self.telemetry = telemetry
        self.result: Any = None

    def __enter__(self) -> None:
        with self.telemetry.log.guard("engine operation"):
            self.activity.hold(1)
        with self.telemetry.log.guard("engine operation"):
            self.scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self.telemetry.log.guard("engine operation"):
            self.scope.__exit__(exc_type, exc, tb)
        with self.telemetry.log.guard("engine operation"):
            if exc is None and self.op.enters:
                self.activity.set_state(self.op.enters, True)
            if exc is None and self.op.leaves and self.result is not False:
                self.activity.set_state(self.op.leaves, False)
            self.activity.hold(-1)
        # None: the engine's exception passes through as it was.


def operation_wrapper(
    telemetry: Telemetry,
    op: EngineOp | Classifier,
    name: str,
    model_of: Callable[[Any], str],
) -> Wrapper:
    """A wrapper timing the engine method ``name`` as operation ``op`` (or as ``op`` classifies
    the call); ``model_of(instance)`` is the engine's model label. Coroutine methods are timed
    from their first step to their end, not from when the coroutine object was made."""

    def begin(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Running | None:
        with telemetry.log.guard("engine operation"):
            if isinstance(op, EngineOp):
                kind, method = op, name
            else:
                found = op(args, kwargs)
                if found is None:
                    return None
                kind, method = found
            model = model_of(instance)
            scope = PhaseScope(
                kind.kind,
                framework=telemetry.provider,
                framework_name=method,
                telemetry=telemetry.steps,
                tracer=telemetry.tracer,
                **engine_attributes(telemetry.provider, model),
            )
            return _Running(kind, telemetry.engine_activity(model), scope, telemetry)
        return None

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not should_observe():
            return wrapped(*args, **kwargs)
        running = begin(instance, args, kwargs)
        if running is None:
            return wrapped(*args, **kwargs)
        if inspect.iscoroutinefunction(wrapped):
            return _awaited(wrapped, args, kwargs, running)
        with running, observing():
            running.result = wrapped(*args, **kwargs)
            return running.result

    return wrapper


async def _awaited(
    wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], running: _Running
) -> Any:
    with running, observing():
        running.result = await wrapped(*args, **kwargs)
        return running.result
