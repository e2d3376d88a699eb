"""``SlimeInstrumentor``: slime's rollouts become rollout steps, with no code change.

slime (0.3) makes each step's samples in ``RolloutManager.generate(rollout_id)``, a method of a
Ray actor its driver calls once per step (``ray.get(rollout_manager.generate.remote(rollout_id))``
in ``train.py``; ``train_async.py`` keeps the next one in flight): the rollout function POSTs each
sample with ``httpx`` to sglang-router, which spreads them over the SGLang servers.
``RolloutManager.eval(rollout_id)`` is that step's evaluation (``rollout.step.validate``).
Running either inside ``rollout_step(rollout_id)`` in the actor makes the step span; the HTTP
client hook counts each POST in it and carries the context through the router to the servers
(:mod:`otel_rollout.http`), so the step counts every request with the engine's own timing.

``RolloutManager`` is decorated ``@ray.remote`` where slime defines it: the module's name is
Ray's ``ActorClass`` and the class reaches the actor's process by value, so there is no module
attribute to patch. The hooks are registered with the Ray instrumentor by the class's name
(:mod:`otel_rollout.ray.actor_hooks`) and run in whichever process serves the actor; nothing of
slime is imported. The step number is slime's own ``rollout_id`` (positional or keyword, as the
drivers pass it); a call without an integer one runs unchanged, and a step the caller already
opened is kept. The step's spans are handed to the exporter as it ends (at most 1 s): Ray kills
the actor, batched spans and all, when the driver ends the job.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from otel_rollout.frameworks.guarded import GuardedStep, as_step, warn_once
from otel_rollout.instrumentation import argument, should_observe
from otel_rollout.ray import actor_hooks
from otel_rollout.steps import current_step

__all__ = ["SlimeInstrumentor"]

ROLLOUT_MODULE = "slime.ray.rollout"
ROLLOUT_CLASS = "RolloutManager"
STEP_ARGUMENT = "rollout_id"


def _rollout_hook(validate: bool) -> actor_hooks.ActorHook:
    def hook(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        step: int | None = None
        attributes: dict[str, Any] = {"validate": True} if validate else {}
        try:
            if should_observe() and current_step() is None:
                step = as_step(argument(args, kwargs, 0, STEP_ARGUMENT))
                algorithm = getattr(getattr(instance, "args", None), "advantage_estimator", None)
                if isinstance(algorithm, str):  # slime's --advantage-estimator (grpo, ppo, …)
                    attributes["algorithm"] = algorithm
        except Exception as exc:
            warn_once("slime", "reading slime's rollout_id", exc)
            step = None
        if step is None:
            return wrapped(*args, **kwargs)
        if inspect.iscoroutinefunction(wrapped):

            async def run() -> Any:
                async with GuardedStep(step, attributes, framework="slime", flush=True):
                    return await wrapped(*args, **kwargs)

            return run()
        with GuardedStep(step, attributes, framework="slime", flush=True):
            return wrapped(*args, **kwargs)

    return hook


HOOKS: tuple[tuple[str, actor_hooks.ActorHook], ...] = (
    ("generate", _rollout_hook(False)),
    ("eval", _rollout_hook(True)),
)
"""slime's ``RolloutManager`` methods made steps: training rollouts, evaluation rollouts."""


class SlimeInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Puts each slime rollout (``RolloutManager.generate`` / ``eval``) into its step."""

    def instrumentation_dependencies(self) -> Collection[str]:
        # slime is not on PyPI (the PyPI name ``slime`` is another project) and nothing of it is
        # imported here: the hooks match slime's actor class by name, in whichever process
        # serves it. What they rely on is held to slime's released source by the suite.
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        for method, hook in HOOKS:
            actor_hooks.register(ROLLOUT_MODULE, ROLLOUT_CLASS, method, hook)

    def _uninstrument(self, **kwargs: Any) -> None:
        for method, hook in HOOKS:
            actor_hooks.unregister(ROLLOUT_MODULE, ROLLOUT_CLASS, method, hook)
