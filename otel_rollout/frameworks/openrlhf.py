"""``OpenRLHFInstrumentor``: OpenRLHF's rollouts become rollout steps, with no code change.

OpenRLHF (0.11) makes each step's samples in ``SamplesGenerator.generate_samples()``, called by
``PPOTrainer.fit``: it sends every prompt to the ``RolloutRayActor`` engines (``AsyncLLMEngine``
in Ray actors) with ``generate_responses.remote`` and waits for them all. Running that call
inside ``rollout_step(n)`` makes the step span; the Ray instrumentor carries the step into the
rollout actors and brings their requests home to it (:mod:`otel_rollout.ray.steps`), so the
step counts every request wherever it was served.

The step number is OpenRLHF's own, read where OpenRLHF keeps it: a local ``global_step`` of the
caller (``fit``), which ``train_step`` bumps once the samples are trained on — so this rollout's
step is ``global_step + 1``, the number OpenRLHF then logs its status under ("Global step N").
The async trainer's rollout loop holds the trainer's latest ``global_step`` from its slot token
the same way. ``generate_eval_samples``, called by ``evaluate(global_step)``, is that step's
evaluation: ``rollout.step.validate``. A call whose caller has no ``global_step`` runs unchanged
(a step number is never invented); when the caller already opened a step, it is kept.

Nothing is imported up front: the patch is applied when the process imports OpenRLHF's samples
generator (a post-import hook).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from otel_rollout.frameworks.guarded import GuardedStep, as_step, framework_frame, warn_once
from otel_rollout.instrumentation import LibraryInstrumentor, Target, should_observe
from otel_rollout.steps import current_step

__all__ = ["OpenRLHFInstrumentor"]

SAMPLES_MODULE = "openrlhf.trainer.ppo_utils.samples_generator"
STEP_LOCAL = "global_step"


def caller_step(frame: FrameType | None) -> int | None:
    """The caller's local ``global_step`` (wrapt's own frames, present without its C extension,
    skipped); ``None`` where it has none, or not an integer."""
    frame = framework_frame(frame)
    return None if frame is None else as_step(frame.f_locals.get(STEP_LOCAL))


def _rollout_wrapper(validate: bool) -> Callable[..., Any]:
    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        step: int | None = None
        attributes: dict[str, Any] = {"validate": True} if validate else {}
        try:
            if should_observe() and current_step() is None:
                found = caller_step(sys._getframe(1))
                if found is not None:
                    # training: the step these samples will be trained as; eval: the step
                    # being evaluated
                    step = found if validate else found + 1
                    algorithm = _algorithm(instance)
                    if algorithm is not None:
                        attributes["algorithm"] = algorithm
        except Exception as exc:
            warn_once("OpenRLHF", "reading OpenRLHF's global_step", exc)
            step = None
        if step is None:
            return wrapped(*args, **kwargs)
        with GuardedStep(step, attributes, framework="OpenRLHF"):
            return wrapped(*args, **kwargs)

    return wrapper


def _algorithm(generator: Any) -> str | None:
    """OpenRLHF's advantage estimator (``args.algo.advantage.estimator``: ``gae``,
    ``reinforce_baseline``, ``group_norm``…), where its arguments hold one."""
    value: Any = getattr(generator, "args", None)
    for name in ("algo", "advantage", "estimator"):
        value = getattr(value, name, None)
    return value if isinstance(value, str) else None


class OpenRLHFInstrumentor(LibraryInstrumentor):
    """Puts each OpenRLHF rollout into the training step it feeds (``global_step + 1``)."""

    engine_module = "openrlhf"
    engine_name = "OpenRLHF"
    min_version = (0, 11)
    max_tested = (0, 11, 2)

    def _targets(self) -> list[Target]:
        return [
            Target(SAMPLES_MODULE, "SamplesGenerator.generate_samples", _rollout_wrapper(False)),
            Target(
                SAMPLES_MODULE, "SamplesGenerator.generate_eval_samples", _rollout_wrapper(True)
            ),
        ]
