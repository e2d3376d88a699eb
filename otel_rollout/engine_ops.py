"""Engine operations that are not generation: weight sync, sleep and wake-up, pause and resume.

Between two rollouts an RL trainer updates the engine's weights (often 10–80 s a step at scale),
puts a colocated engine to sleep while the trainer uses the GPU, and pauses generation around
the update. Those calls are the engines' own API (vLLM's ``LLM``/``AsyncLLM``, SGLang's
``TokenizerManager``), so they are wrapped here, zero-code, from each engine's ``targets()``:

* each call is a **phase** of the current step (:class:`~otel_rollout.phases.PhaseScope`) named by
  its kind (:class:`EngineOp`, the vocabulary verl's ``update_weights`` timer also maps to), on the
  engine's own tracer (its scope names the engine instrumentation), with the engine's method as
  ``rollout.phase.framework_name``; its seconds are a point of ``rollout.step.phase.duration``
  labelled with the kind, and a call directly under a step adds to the step's phase totals;
* while it runs the engine is **held** (:class:`~otel_rollout.activity.EngineActivity`): neither
  busy nor idle; sleep and pause leave it held (``asleep``, ``paused``) until the wake-up or
  resume call, so ``rollout.engine.idle_time`` only counts time the engine could have generated;
  the wake-up or resume hands that stretch to the step it is called in
  (:meth:`~otel_rollout.steps.StepScope.add_held`), whose causes count it as ``held``.

A call inside another wrapped call (``AsyncLLM.update_weights`` reaching ``collective_rpc``) is
the outer one's business: it is not counted twice. The engine's result and exceptions pass
through untouched; a failure of ours is logged once and the call runs unobserved.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, NamedTuple

from otel_rollout.activity import EngineActivity
from otel_rollout.attributes import engine_attributes
from otel_rollout.context import current_step
from otel_rollout.instrumentation import Wrapper, argument, observing, should_observe
from otel_rollout.phases import PhaseScope
from otel_rollout.telemetry import Telemetry, engine_activities

__all__ = [
    "ENGINE_SLEEP",
    "ENGINE_WAKE",
    "GENERATION_PAUSE",
    "GENERATION_RESUME",
    "WEIGHT_SYNC",
    "Classifier",
    "EngineOp",
    "operation_wrapper",
    "set_weight_version",
    "version_argument",
    "version_field",
    "version_name_wrapper",
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
    version_of: Callable[[tuple[Any, ...], dict[str, Any]], Any] | None = None
    """The weight version the call names, if it can (:mod:`otel_rollout.versions`)."""

    @property
    def updates_weights(self) -> bool:
        return self.kind == WEIGHT_SYNC.kind

    def named(self, version_of: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> EngineOp:
        """This kind, reading the version the call names with ``version_of(args, kwargs)``."""
        return self._replace(version_of=version_of)


WEIGHT_SYNC = EngineOp("weight_sync")
ENGINE_SLEEP = EngineOp("engine_sleep", enters="asleep")
ENGINE_WAKE = EngineOp("engine_wake", leaves="asleep")
GENERATION_PAUSE = EngineOp("generation_pause", enters="paused")
GENERATION_RESUME = EngineOp("generation_resume", leaves="paused")
"""The five kinds: the phase names engine operations use, a bounded label set shared by both
engines."""

Classifier = Callable[[tuple[Any, ...], dict[str, Any]], "tuple[EngineOp, str] | None"]
"""For a generic entry point (``collective_rpc``): the call's kind and name, or ``None`` when
the call is not an operation we time (it then runs unobserved)."""


def weight_rpc(owner: str) -> Classifier:
    """vLLM's ``collective_rpc(method, …)``: a weight sync when the method's name says weights.

    RL frameworks reload or receive weights through worker RPCs of their own naming
    (``reload_weights``, prime-rl's and NeMo-RL's ``update_weights*``); every other RPC
    (``get_model``, metrics, …) is none of our business and runs unobserved.
    """

    def classify(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[EngineOp, str] | None:
        method = argument(args, kwargs, 0, "method")
        name = method if isinstance(method, str) else getattr(method, "__name__", "")
        if not isinstance(name, str) or "weight" not in name.lower():
            return None
        return WEIGHT_SYNC, f"{owner}.collective_rpc:{name}"

    return classify


def version_argument(position: int, name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """The version a call passes as argument ``name`` (vLLM's ``finish_weight_update``)."""
    return lambda args, kwargs: argument(args, kwargs, position, name)


def version_field(position: int, name: str) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """The version in field ``name`` of the request object a call takes (SGLang's ``obj``)."""
    return lambda args, kwargs: getattr(argument(args, kwargs, position, "obj"), name, None)


class _Running:
    """One operation in progress: the engine held, its phase open (a sync context manager)."""

    __slots__ = ("op", "activity", "scope", "telemetry", "result", "version")

    def __init__(
        self,
        op: EngineOp,
        activity: EngineActivity,
        scope: PhaseScope,
        telemetry: Telemetry,
        version: Any = None,
    ) -> None:
        self.op = op
        self.activity = activity
        self.scope = scope
        self.telemetry = telemetry
        self.result: Any = None
        self.version = version

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
                held = self.activity.set_state(self.op.leaves, False)
                step = current_step()
                if held is not None and step is not None and hasattr(step, "add_held"):
                    step.add_held(self.op.leaves, *held)
            if exc is None and self.op.updates_weights and _succeeded(self.result):
                self.activity.weights.updated(time.time_ns(), self.version)
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
            version = kind.version_of(args, kwargs) if kind.version_of else None
            scope = PhaseScope(
                kind.kind,
                framework=telemetry.provider,
                framework_name=method,
                telemetry=telemetry.steps,
                tracer=telemetry.tracer,
                **engine_attributes(telemetry.provider, model),
            )
            return _Running(kind, telemetry.engine_activity(model), scope, telemetry, version)
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


def version_name_wrapper(
    telemetry: Telemetry,
    version_of: Callable[[tuple[Any, ...], dict[str, Any]], Any],
    model_of: Callable[[Any], str],
) -> Wrapper:
    """An engine call that names the version of the weights it runs without loading any
    (vLLM's ``AsyncLLM.update_weight_version``, ``LLMEngine.set_weight_version``): once it
    returned, requests arriving carry that name (source ``named``) and updates no longer count.
    Not an operation: nothing is held and no phase is timed. Inside another wrapped call
    (``finish_weight_update(weight_version=…)`` names through it) the outer call names it."""

    def name(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with telemetry.log.guard("engine operation"):
            version = version_of(args, kwargs)
            if version is not None:
                activity = telemetry.engine_activity(model_of(instance))
                activity.weights.name(time.time_ns(), version)

    async def named_after(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        result = await wrapped(*args, **kwargs)
        name(instance, args, kwargs)
        return result

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not should_observe():
            return wrapped(*args, **kwargs)
        if inspect.iscoroutinefunction(wrapped):
            return named_after(wrapped, instance, args, kwargs)
        result = wrapped(*args, **kwargs)
        name(instance, args, kwargs)
        return result

    return wrapper


def _succeeded(result: Any) -> bool:
    """Whether a weight update returned success: SGLang returns ``(success, message, …)``."""
    if isinstance(result, tuple) and result and isinstance(result[0], bool):
        return result[0]
    return True


def set_weight_version(version: int | str, model: str | None = None) -> None:
    """The engines of this process run weights ``version`` from now on (``model``: only that one).

    For trainers that number their policy versions themselves (fully-async RL): every request
    arriving from now on carries it (``rollout.weight.version``), and weight updates the
    instrumentation sees no longer count versions up by themselves. Call it where the new weights
    are loaded, in the process that runs the engine.
    """
    now = time.time_ns()
    for _provider, name, activity in engine_activities():
        if model is None or name == model:
            activity.weights.name(now, version)


async def _awaited(
    wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], running: _Running
) -> Any:
    with running, observing():
        running.result = await wrapped(*args, **kwargs)
        return running.result
