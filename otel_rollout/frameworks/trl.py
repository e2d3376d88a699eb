"""``TRLInstrumentor``: TRL's own generation rounds become rollout steps, with no code change.

TRL's online trainers (``GRPOTrainer``, ``RLOOTrainer``) generate in
``_generate_and_score_completions(inputs)``: one call per generation round, which prompts the
engine (``vllm_mode="colocate"``: ``vllm.LLM.generate`` in every rank; ``"server"``: HTTP to
``trl vllm-serve``), scores the completions and computes advantages. One round feeds
``steps_per_generation`` optimizer steps. Running that call inside
``rollout_step(trainer.state.global_step)`` makes the step span, with every request the engine
instrumentor observes under it, carry TRL's own step number (the number TRL logs its metrics
with); a round while the model is in eval mode (``trainer.evaluate``) is marked
``rollout.step.validate``. When the caller already opened a step, the caller's step is kept.

The step's phases come from TRL's own timers. TRL times its parts with ``profiling_context(
trainer, name)`` (``trl.extras.profiling.ProfilingContext``; the numbers it logs as
``profiling/Time taken: <Trainer>.<name>`` to wandb, MLflow or trackio): every timer that runs
inside a step becomes a phase (:mod:`otel_rollout.phases`) named in the common vocabulary
(:data:`TRL_PHASES`: ``vLLM.generate`` → ``generation``, ``sync_weights`` → ``weight_sync``, …),
TRL's own name kept as ``rollout.phase.framework_name``. TRL's timers nest (each reward
function's inside ``_calculate_rewards``): so do the phases.

The weight sync TRL does at the start of each round (``VLLMGeneration.sync_weights``: in colocate
mode each parameter is loaded straight into the engine's model, a path no engine API sees) names
the engine's weights after the step whose policy it loaded: requests of step N carry
``rollout.weight.version`` N (source ``named``), as TRL's own ``_last_loaded_step`` says.

Nothing is imported up front: the patches are applied when the process imports TRL's modules
(post-import hooks), so an engine-core child that never imports TRL pays nothing.

Colocated under ``torchrun`` / ``accelerate launch``, every rank runs the round with an engine of
its own: the ranks' step spans of one round share one trace (:mod:`otel_rollout.ranks`: ids
derived from the run id and the round; rank 0's span the root), each with its own rank's
requests and figures (``rollout.step.rank`` of ``rollout.step.ranks``).

In server mode TRL's ``VLLMClient`` POSTs each round's prompts with ``requests``: the HTTP
client hook (:mod:`otel_rollout.http`) carries the step to vLLM's server and counts one request
per prompt in the step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from otel_rollout.config import load_config
from otel_rollout.engine_ops import set_weight_version
from otel_rollout.frameworks.guarded import GuardedStep, as_step, warn_once
from otel_rollout.instrumentation import LibraryInstrumentor, Target, should_observe
from otel_rollout.phases import PhaseScope
from otel_rollout.ranks import SharedStep, job_ranks, shared_step
from otel_rollout.steps import current_step
from otel_rollout.telemetry import engine_activity_of
from otel_rollout.vllm.adapter import PROVIDER as VLLM
from otel_rollout.vllm.adapter import model_name

__all__ = ["TRL_PHASES", "TRLInstrumentor"]

TRAINERS = (
    ("trl.trainer.grpo_trainer", "GRPOTrainer"),
    ("trl.trainer.rloo_trainer", "RLOOTrainer"),
)
"""TRL's online trainers whose ``_generate_and_score_completions`` is a generation round."""
PROFILING_MODULE = "trl.extras.profiling"
GENERATION_MODULE = "trl.generation.vllm_generation"
TRL_PHASES = {
    "vLLM.generate": "generation",
    "transformers.generate": "generation",
    "transformers.generate_batch": "generation",
    "sync_weights": "weight_sync",
    "_calculate_rewards": "reward",
    "_get_per_token_logps_and_entropies": "log_probs",
    "compute_loss": "actor_update",
}
"""TRL's timer names (less the trainer's class name) → the phase vocabulary shared with verl's
and ``rollout_phase`` users; a timer not listed (a reward function's, named after it) keeps
TRL's name: bounded by the program's code, and by :data:`~otel_rollout.phases.MAX_PHASE_NAMES`."""
_PHASE_ATTR = "_otel_rollout_phase"
"""Where an open ``ProfilingContext`` keeps its phase: TRL enters and exits the same object."""


def _warn(what: str, exc: BaseException) -> None:
    warn_once("TRL", what, exc)


def step_of(trainer: Any) -> tuple[int | None, dict[str, Any]]:
    """TRL's step number (``trainer.state.global_step``) and the step's attributes: a round in
    eval mode (``trainer.model.training`` false, as TRL itself decides) is ``validate``."""
    value = as_step(getattr(getattr(trainer, "state", None), "global_step", None))
    if value is None:
        return None, {}
    training = getattr(getattr(trainer, "model", None), "training", True)
    attributes: dict[str, Any] = {} if training else {"validate": True}
    algorithm = algorithm_of(trainer)
    if algorithm is not None:
        attributes["algorithm"] = algorithm
    return value, attributes


def algorithm_of(trainer: Any) -> str | None:
    """``grpo`` or ``rloo``: the TRL trainer the user's class is (or derives from)."""
    for cls in type(trainer).__mro__:
        if (cls.__module__, cls.__name__) in TRAINERS:
            return cls.__name__.removesuffix("Trainer").lower()
    return None


def generate_round_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``_generate_and_score_completions`` inside ``rollout_step(state.global_step)``."""
    try:
        step, attributes = step_of(instance)
        if step is not None and (not should_observe() or current_step() is not None):
            step = None  # suppressed, or the caller opened its own step: leave TRL alone
    except Exception as exc:
        _warn("reading TRL's global_step", exc)
        step = None
    if step is None:
        return wrapped(*args, **kwargs)
    shared = None
    try:
        shared = _shared(step, attributes)
    except Exception as exc:
        _warn("deriving the ranks' shared step", exc)
    with GuardedStep(step, attributes, framework="TRL", shared=shared):
        return wrapped(*args, **kwargs)


_rounds: dict[str, int] = {}
"""Rounds opened so far per step number and mode (eval repeats its step number, once per eval
batch): the same count in every rank, which run the same schedule. The newest
:data:`ROUNDS_KEPT` keys only: a step's rounds come together."""
ROUNDS_KEPT = 64


def _shared(step: int, attributes: dict[str, Any]) -> SharedStep | None:
    """In a multi-rank job (``torchrun``/``accelerate``: one engine per rank, colocated), the
    ids every rank derives for this round: the ranks' step spans land in one trace."""
    ranks = job_ranks(load_config(warn=False).run_id)
    if ranks is None:
        return None
    mode = "eval" if attributes.get("validate") else "train"
    round_key = f"{step}/{mode}"
    seen = _rounds.pop(round_key, 0)
    _rounds[round_key] = seen + 1  # re-inserted: the newest
    while len(_rounds) > ROUNDS_KEPT:
        del _rounds[next(iter(_rounds))]
    return shared_step(ranks, f"{round_key}/{seen}")


def timer_name(name: Any) -> str | None:
    """TRL's timer name without the trainer class TRL prefixes it with (``GRPOTrainer.``)."""
    if not isinstance(name, str) or not name:
        return None
    return name.split(".", 1)[1] if "." in name else name


def _phase(name: str) -> Callable[[], PhaseScope]:
    return lambda: PhaseScope(TRL_PHASES.get(name, name), framework="trl", framework_name=name)


def timer_enter_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``ProfilingContext.__enter__``: a phase opens first (inside a step), then TRL's timer, so
    what TRL measures lies within the span."""
    scope: GuardedStep | None = None
    try:
        name = timer_name(getattr(instance, "name", None))
        if name is not None and should_observe() and current_step() is not None:
            scope = GuardedStep(0, {}, phase=_phase(name), framework="TRL")
            scope.__enter__()
            setattr(instance, _PHASE_ATTR, scope)
    except Exception as exc:
        _warn("reading TRL's timer", exc)
    try:
        return wrapped(*args, **kwargs)
    except BaseException as exc:
        _close(instance, type(exc), exc, exc.__traceback__)
        raise


def timer_exit_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``ProfilingContext.__exit__``: TRL's timer closes (and logs), then the phase."""
    try:
        return wrapped(*args, **kwargs)
    finally:
        exc = args[1] if len(args) > 1 and isinstance(args[1], BaseException) else None
        _close(instance, type(exc) if exc is not None else None, exc, None)


def _close(
    instance: Any,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> None:
    scope = instance.__dict__.pop(_PHASE_ATTR, None) if hasattr(instance, "__dict__") else None
    if isinstance(scope, GuardedStep):
        scope.__exit__(exc_type, exc, tb)


def sync_weights_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``VLLMGeneration.sync_weights``: once it returned, the engine runs the weights of the open
    step's policy — named after TRL's step number. Colocated, the engine is TRL's own ``llm``
    (named even before its first request: the first round syncs before it generates); in server
    mode the engine is in ``trl vllm-serve``'s process and only this process's engines, if any,
    are named."""
    result = wrapped(*args, **kwargs)
    try:
        number = getattr(current_step(), "step", None)
        if should_observe() and isinstance(number, int):
            llm = getattr(instance, "llm", None)
            activity = None if llm is None else engine_activity_of(VLLM, model_name(llm))
            if activity is not None:
                activity.weights.name(time.time_ns(), number)
            else:
                set_weight_version(number)
    except Exception as exc:
        _warn("naming the synced weights", exc)
    return result


class TRLInstrumentor(LibraryInstrumentor):
    """Puts each TRL generation round into the training step TRL is on (``global_step``)."""

    engine_module = "trl"
    engine_name = "TRL"
    min_version = (1, 0)
    max_tested = (1, 16, 0)

    def _targets(self) -> list[Target]:
        return [
            *(
                Target(module, f"{cls}._generate_and_score_completions", generate_round_wrapper)
                for module, cls in TRAINERS
            ),
            Target(PROFILING_MODULE, "ProfilingContext.__enter__", timer_enter_wrapper),
            Target(PROFILING_MODULE, "ProfilingContext.__exit__", timer_exit_wrapper),
            Target(GENERATION_MODULE, "VLLMGeneration.sync_weights", sync_weights_wrapper),
        ]
