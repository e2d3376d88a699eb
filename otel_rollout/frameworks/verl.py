"""``VerlInstrumentor``: verl's own step number becomes the rollout step, with no code change.

verl's trainer puts the step into ``DataProto.meta_info["global_steps"]`` and hands the batch to
``AgentLoopManager.generate_sequences`` (``verl/experimental/agent_loop/agent_loop.py``), the one
call that fans a step's samples out to the agent-loop workers and waits for all of them. Running
that call inside ``rollout_step(global_steps)`` makes the step span, and every request observed
under it, carry verl's number. A batch without ``global_steps`` runs unchanged: a step number is
never invented. When the caller already opened a step, the caller's step is kept.

verl's ``generate_sequences`` is an ``async def`` behind verl's ``auto_await`` facade, which
returns the coroutine to an ``async`` caller and runs it to completion for a sync caller, judged
by the calling frame. The wrapper keeps that contract: it decides the same way from its own
caller and, for an async caller, calls verl from a coroutine of its own, so verl still sees an
async caller and still returns an awaitable.

verl's modules are heavy to import (torch, ray, transformers: ~5 s here), and
``opentelemetry-instrument`` runs in every process of a job, vLLM's engine-core children included.
So nothing is imported up front: the patch is applied when the process itself imports verl's
agent-loop module (a post-import hook), or at once when it already has.

The whole training step comes from verl's own timers. verl times every phase of every step with
``marked_timer(name, timing_raw)`` (``verl.utils.profiler``, re-exported by ``verl.utils.debug``;
the numbers it logs as ``timing_s/<name>``). Wrapping it where it is defined — before any trainer
binds it with ``from … import marked_timer`` — gives, on both trainer paths (the default v1
``PPOTrainer`` and the legacy ``RayPPOTrainer``) and in recipes built on them:

* ``marked_timer("step")`` → ``rollout_step(trainer.global_steps)``, read off the trainer that
  opened the timer (``self.global_steps`` in verl's ``fit``): the training step's span, with every
  request of the step inside it (the agent-loop hook then keeps that step);
* every other timer inside a step → a phase (:mod:`otel_rollout.phases`) named in the common
  vocabulary (:data:`VERL_PHASES`: ``gen`` → ``generation``, ``update_weights`` → ``weight_sync``,
  …), verl's own name kept as ``rollout.phase.framework_name``.

Each sample's agent loop becomes a trajectory (:mod:`otel_rollout.frameworks.verl_agent_loop`).

No legacy/SPMD boundary is wrapped: verl 0.9.1 retired the SPMD rollout (its vLLM
``ServerAdapter.generate_sequences`` raises ``NotImplementedError``); what remains
(``HFRollout``, ``NaiveRollout``) generates with plain transformers, where no engine instrumentor
observes requests, and runs in the trainer's worker processes, not where the step is known.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from otel_rollout.frameworks.guarded import GuardedStep, as_step, framework_frame, warn_once
from otel_rollout.frameworks.verl_agent_loop import agent_loop_targets
from otel_rollout.instrumentation import LibraryInstrumentor, Target, argument, should_observe
from otel_rollout.phases import PhaseScope
from otel_rollout.steps import current_step

__all__ = ["VERL_PHASES", "VerlInstrumentor"]

_logger = logging.getLogger(__name__)

AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
TIMER_MODULES = ("verl.utils.profiler", "verl.utils.debug")
"""Where trainers import ``marked_timer`` from (``debug`` star-imports ``profiler``'s)."""
STEP_TIMER = "step"
VERL_PHASES = {
    "gen": "generation",
    "reward": "reward",
    "old_log_prob": "old_log_prob",
    "ref": "reference",
    "values": "values",
    "adv": "advantage",
    "update_critic": "critic_update",
    "update_actor": "actor_update",
    "update_weights": "weight_sync",
    "save_checkpoint": "checkpoint",
    "testing": "validation",
}
"""verl's timer names → the phase vocabulary shared with ``rollout_phase`` users; a timer not
listed keeps verl's name (verl's names are literals in its code: the set stays bounded)."""


def _warn_once(what: str, exc: BaseException) -> None:
    """Our failure around verl's call: said once per site, and verl runs on without a step."""
    warn_once("verl", what, exc)


def step_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
    """verl's step number and step attributes from the call's ``DataProto``; ``None`` if absent.

    The batch is ``generate_sequences``' one argument (``prompts=`` by keyword in verl's own
    callers). Only an integral ``global_steps`` counts; ``validate`` (verl's validation rollouts
    reuse the step number they validate) becomes the ``rollout.step.validate`` attribute.
    """
    batch = argument(args, kwargs, 0, "prompts", "batch")
    meta = getattr(batch, "meta_info", None)
    if not isinstance(meta, dict):
        return None, {}
    value = meta.get("global_steps")
    if value is None or isinstance(value, bool):
        return None, {}
    try:
        step = int(value)
    except (TypeError, ValueError):
        return None, {}
    if step != value:  # 2.5 or "7": not a step number verl would use
        return None, {}
    attributes = {"validate": True} if meta.get("validate") is True else {}
    return step, attributes


def _is_coroutine_frame(frame: FrameType | None) -> bool:
    """Whether ``frame`` (the wrapper's caller) is a coroutine: verl's own test, made on the
    frame verl would have seen. wrapt's frames (none with its C extension) are skipped."""
    frame = framework_frame(frame)
    return frame is not None and bool(frame.f_code.co_flags & inspect.CO_COROUTINE)


def _returns_awaitable(wrapped: Callable[..., Any], caller: FrameType | None) -> bool:
    """True when verl would hand this caller an awaitable instead of a result.

    A plain ``async def`` always does; verl's ``auto_await`` facade (a sync function whose
    ``__wrapped__`` is a coroutine function) does when a loop is running and the caller is async.
    """
    if inspect.iscoroutinefunction(wrapped):
        return True
    if not inspect.iscoroutinefunction(getattr(wrapped, "__wrapped__", None)):
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return _is_coroutine_frame(caller)


async def _in_step_async(
    wrapped: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    step: int,
    attributes: dict[str, Any],
) -> Any:
    async with GuardedStep(step, attributes):
        # Called from this coroutine, verl's auto_await sees an async caller: it returns the
        # coroutine, as it would have to the original caller.
        return await wrapped(*args, **kwargs)


def generate_sequences_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``AgentLoopManager.generate_sequences`` inside ``rollout_step(meta_info["global_steps"])``."""
    try:
        step, attributes = step_of(args, kwargs)
        if step is not None and (not should_observe() or current_step() is not None):
            step = None  # suppressed, or the caller opened its own step: leave verl alone
        awaitable = step is not None and _returns_awaitable(wrapped, sys._getframe(1))
    except Exception as exc:
        _warn_once("reading verl's global_steps", exc)
        step = None
    if step is None:
        return wrapped(*args, **kwargs)
    if awaitable:
        return _in_step_async(wrapped, args, kwargs, step, attributes)
    with GuardedStep(step, attributes):
        return wrapped(*args, **kwargs)


def _trainer_step(frame: FrameType | None) -> int | None:
    """``self.global_steps`` of the trainer method that opened the timer (``frame``: its caller;
    wrapt's own frames, present without its C extension, and a re-export's wrapper are skipped)."""
    frame = framework_frame(frame, skip_module=__name__)
    if frame is None:
        return None
    return as_step(getattr(frame.f_locals.get("self"), "global_steps", None))


class _Timed:
    """verl's timer inside our step or phase: ours opens first and closes last, so what verl
    logs lies within the span; the timer's own result (and any exception) is verl's."""

    def __init__(self, timer: Any, scope: GuardedStep) -> None:
        self.timer = timer
        self.scope = scope

    def __enter__(self) -> Any:
        self.scope.__enter__()
        try:
            return self.timer.__enter__()
        except BaseException as exc:
            self.scope.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any:
        try:
            return self.timer.__exit__(exc_type, exc, tb)
        finally:
            self.scope.__exit__(exc_type, exc, tb)


def _phase(name: str) -> Callable[[], PhaseScope]:
    return lambda: PhaseScope(VERL_PHASES.get(name, name), framework="verl", framework_name=name)


def marked_timer_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """verl's ``marked_timer(name, timing_raw, …)``: the training step, or one of its phases."""
    if getattr(wrapped, "_self_wrapper", None) is marked_timer_wrapper:
        return wrapped(*args, **kwargs)  # a re-export of the wrapped timer: translated once
    scope: GuardedStep | None = None
    try:
        name = argument(args, kwargs, 0, "name")
        if should_observe() and isinstance(name, str):
            if name == STEP_TIMER:
                step = _trainer_step(sys._getframe(1))
                if step is not None and current_step() is None:
                    scope = GuardedStep(step, {})
            elif current_step() is not None:
                scope = GuardedStep(0, {}, phase=_phase(name))
    except Exception as exc:
        _warn_once("reading verl's timer", exc)
        scope = None
    timer = wrapped(*args, **kwargs)
    return timer if scope is None else _Timed(timer, scope)


class VerlInstrumentor(LibraryInstrumentor):
    """Puts each verl rollout call into the training step verl is on (``global_steps``)."""

    engine_module = "verl"
    engine_name = "verl"
    min_version = (0, 5)
    max_tested = (0, 9, 1)

    def _targets(self) -> list[Target]:
        return [
            Target(
                AGENT_LOOP_MODULE, "AgentLoopManager.generate_sequences", generate_sequences_wrapper
            ),
            *(Target(module, "marked_timer", marked_timer_wrapper) for module in TIMER_MODULES),
            *agent_loop_targets(),
        ]
