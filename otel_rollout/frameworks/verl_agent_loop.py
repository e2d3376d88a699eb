"""verl's agent loop, zero-code: each sample's agent loop becomes one trajectory.

verl runs every sample of a step as one agent-loop coroutine in an ``AgentLoopWorker`` Ray
actor (``verl/experimental/agent_loop/agent_loop.py``): ``AgentLoopWorker._run_agent_loop``
instantiates the registered loop (``SingleTurnAgentLoop``, ``ToolAgentLoop``, a user's own),
awaits its ``run``, then post-processes the output, scoring it in ``_compute_score``. Its turns
are ``LLMServerClient.generate`` calls (``verl/workers/rollout/llm_server.py``), each a Ray call
to the server actor that holds the engine; its tool calls are ``ToolAgentLoop._call_tool``.
Wrapping those four gives, with no change to verl or the user's loop:

* ``_run_agent_loop`` → :class:`~otel_rollout.trajectories.TrajectoryScope` named after verl's
  ``agent_name``, the group id verl's sample index, the sample id ``<index>-<rollout_n>`` (GRPO's
  n rollouts of one prompt), ``rollout.trajectory.validate`` on validation rollouts, and the
  reward verl computed (``reward_score``);
* ``LLMServerClient.generate`` → a turn, timed by the client around the Ray call (the engine's
  own record is made in the server actor, under this trajectory's span, and reaches the step
  there); its tokens are the ``TokenOutput``'s; a turn verl reports ``aborted`` makes the
  trajectory ``aborted``;
* ``ToolAgentLoop._call_tool`` → ``execute_tool <name>``;
* ``AgentLoopWorker._compute_score`` → ``rollout.scoring``.

The worker is another process than the trainer's step: the trajectory reaches the step through
the Ray step channel (:mod:`otel_rollout.ray.steps`), as the server's requests do. Every wrapper
is ``async`` like what it wraps, returns verl's result and re-raises verl's exception; our own
failures are logged once and the call runs unobserved.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from opentelemetry import context as otel_context

from otel_rollout.context import current_trajectory, with_trajectory
from otel_rollout.guard import LogOnce
from otel_rollout.instrumentation import Target, argument, should_observe
from otel_rollout.trajectories import TrajectoryScope, rollout_scoring, rollout_tool

__all__ = ["agent_loop_targets"]

AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
TOOL_LOOP_MODULE = "verl.experimental.agent_loop.tool_agent_loop"
CLIENT_MODULE = "verl.workers.rollout.llm_server"
ABORTED = "aborted"
"""``TokenOutput.stop_reason`` of a turn verl aborted (partial rollout, weight update)."""
_log = LogOnce()


def _failed(what: str, exc: BaseException) -> None:
    _log.failed(f"verl agent loop ({what}; verl runs on unobserved)", exc)


def trajectory_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> TrajectoryScope:
    """The trajectory of one ``_run_agent_loop(sampling_params, trajectory, *, agent_name, …)``
    call: verl's ``trajectory`` dict holds ``sample_index``, ``rollout_n`` and ``validate``."""
    info = argument(args, kwargs, 1, "trajectory") or {}
    agent = str(kwargs.get("agent_name") or "agent_loop")
    index, rollout_n = info.get("sample_index"), info.get("rollout_n")
    attributes: dict[str, Any] = {"validate": True} if info.get("validate") is True else {}
    return TrajectoryScope(
        agent,
        sample_id=None if index is None else f"{index}-{rollout_n or 0}",
        group_id=None if index is None else str(index),
        **attributes,
    )


async def _observed(
    scope: AbstractAsyncContextManager[Any] | None,
    call: Callable[[], Awaitable[Any]],
    after: Callable[[Any, Any], None] | None = None,
) -> Any:
    """``await call()`` inside ``scope`` (``None``: unobserved); ``after(scope, result)`` is ours
    and may fail without touching verl's result."""
    if scope is None:
        return await call()
    try:
        entered = await scope.__aenter__()
    except Exception as exc:
        _failed("opening a span", exc)
        return await call()
    try:
        result = await call()
    except BaseException as exc:
        await scope.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    if after is not None:
        try:
            after(entered, result)
        except Exception as exc:
            _failed("reading verl's output", exc)
    await scope.__aexit__(None, None, None)
    return result


def _set_reward(trajectory: TrajectoryScope, output: Any) -> None:
    reward = getattr(output, "reward_score", None)
    if isinstance(reward, (int, float)) and not isinstance(reward, bool):
        trajectory.set_reward(float(reward))


def run_agent_loop_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``AgentLoopWorker._run_agent_loop``: one sample's agent loop, one trajectory."""
    scope: TrajectoryScope | None = None
    try:
        if should_observe():
            scope = trajectory_of(args, kwargs)
    except Exception as exc:
        _failed("reading verl's trajectory info", exc)
    return _observed(scope, lambda: wrapped(*args, **kwargs), _set_reward)


async def _turn(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    trajectory = current_trajectory()
    if not isinstance(trajectory, TrajectoryScope):
        return await wrapped(*args, **kwargs)
    # The turn is counted here; an engine in this process serving it must not count it again.
    token = otel_context.attach(with_trajectory(None, otel_context.get_current()))
    start = time.time_ns()
    try:
        output = await wrapped(*args, **kwargs)
    finally:
        end = time.time_ns()
        otel_context.detach(token)
    try:
        tokens = getattr(output, "token_ids", None)
        trajectory.observe_turn(start, end, len(tokens) if tokens is not None else None)
        if getattr(output, "stop_reason", None) == ABORTED and trajectory.status is None:
            trajectory.set_status("aborted")
    except Exception as exc:
        _failed("counting a turn", exc)
    return output


def generate_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``LLMServerClient.generate``: one turn of the current trajectory."""
    if not should_observe():
        return wrapped(*args, **kwargs)
    return _turn(wrapped, args, kwargs)


def call_tool_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``ToolAgentLoop._call_tool(tool_call, tools_kwargs, agent_data)``: one tool call."""
    scope = None
    try:
        if should_observe() and current_trajectory() is not None:
            call = argument(args, kwargs, 0, "tool_call")
            call_id = getattr(call, "tool_call_id", None)
            scope = rollout_tool(
                str(getattr(call, "name", "tool")), None if call_id is None else str(call_id)
            )
    except Exception as exc:
        _failed("reading the tool call", exc)
    return _observed(scope, lambda: wrapped(*args, **kwargs))


def compute_score_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``AgentLoopWorker._compute_score``: the trajectory's scoring."""
    scope = rollout_scoring() if should_observe() and current_trajectory() is not None else None
    return _observed(scope, lambda: wrapped(*args, **kwargs))


def agent_loop_targets() -> list[Target]:
    return [
        Target(AGENT_LOOP_MODULE, "AgentLoopWorker._run_agent_loop", run_agent_loop_wrapper),
        Target(AGENT_LOOP_MODULE, "AgentLoopWorker._compute_score", compute_score_wrapper),
        Target(TOOL_LOOP_MODULE, "ToolAgentLoop._call_tool", call_tool_wrapper),
        Target(CLIENT_MODULE, "LLMServerClient.generate", generate_wrapper),
    ]
