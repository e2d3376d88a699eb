"""The TRL hook's own decisions, without TRL (its real trainers run in tests/trl): TRL's step and
mode read off the trainer, timer names, a caller's step kept, TRL's results and exceptions
untouched, and a failure of ours leaving TRL's call alone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from otel_rollout import rollout_step
from otel_rollout.frameworks import guarded
from otel_rollout.frameworks import trl as hook
from tests.conftest import OTelHarness


def trainer(step: Any, training: bool = True) -> Any:
    """The two attributes TRL's trainers have that the hook reads (``state``, ``model``)."""
    return SimpleNamespace(
        state=SimpleNamespace(global_step=step), model=SimpleNamespace(training=training)
    )


def steps(otel: OTelHarness) -> list[Any]:
    return [s for s in otel.finished_spans() if s.name == "rollout.step"]


def test_trls_step_and_mode() -> None:
    assert hook.step_of(trainer(7)) == (7, {})
    assert hook.step_of(trainer(7, training=False)) == (7, {"validate": True})
    assert hook.step_of(trainer(None)) == (None, {})
    assert hook.step_of(trainer(True)) == (None, {})  # a bool is not a step number
    assert hook.step_of(object()) == (None, {})


def test_timer_names_lose_the_trainer_class() -> None:
    assert hook.timer_name("GRPOTrainer.vLLM.generate") == "vLLM.generate"
    assert hook.timer_name("MyRLOO.sync_weights") == "sync_weights"
    assert hook.timer_name("plain") == "plain"
    assert hook.timer_name("") is None and hook.timer_name(None) is None


def test_a_round_is_a_step_and_its_result_is_trls(otel: OTelHarness) -> None:
    result = object()
    got = hook.generate_round_wrapper(lambda inputs: result, trainer(4), (["x"],), {})
    assert got is result
    assert [s.attributes["rollout.step"] for s in steps(otel)] == [4]


def test_a_callers_own_step_is_kept(otel: OTelHarness) -> None:
    with rollout_step(40):
        hook.generate_round_wrapper(lambda: None, trainer(4), (), {})
    assert [s.attributes["rollout.step"] for s in steps(otel)] == [40]


def test_trls_exception_passes_through_and_ends_the_step(otel: OTelHarness) -> None:
    class TRLError(Exception):
        pass

    def fails() -> None:
        raise TRLError("trl's")

    with pytest.raises(TRLError, match="trl's"):
        hook.generate_round_wrapper(fails, trainer(5), (), {})
    assert [s.attributes["error.type"].rsplit(".", 1)[-1] for s in steps(otel)] == ["TRLError"]


def test_our_failure_leaves_trls_call_alone(
    otel: OTelHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAKE FAULT: rollout_step replaced by one that raises (no real input makes ours fail)."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("ours")

    monkeypatch.setattr(guarded, "rollout_step", broken)
    assert hook.generate_round_wrapper(lambda: "trl's", trainer(6), (), {}) == "trl's"
    assert steps(otel) == []


class Timer:
    """What the hook sees of TRL's ``ProfilingContext``: its ``name``, entered and exited."""

    def __init__(self, name: str) -> None:
        self.name = name


def test_a_timer_inside_a_step_is_a_phase_named_in_the_shared_vocabulary(
    otel: OTelHarness,
) -> None:
    timer = Timer("GRPOTrainer.sync_weights")
    with rollout_step(2):
        hook.timer_enter_wrapper(lambda: timer, timer, (), {})
        hook.timer_exit_wrapper(lambda *a: False, timer, (None, None, None), {})
    outside = Timer("GRPOTrainer.compute_loss")  # no step open: no phase
    hook.timer_enter_wrapper(lambda: outside, outside, (), {})
    hook.timer_exit_wrapper(lambda *a: False, outside, (None, None, None), {})
    phases = [s for s in otel.finished_spans() if s.name.startswith("rollout.phase")]
    assert [
        (s.attributes["rollout.phase.name"], s.attributes["rollout.phase.framework_name"])
        for s in phases
    ] == [("weight_sync", "sync_weights")]
    assert not hasattr(timer, hook._PHASE_ATTR)  # nothing of ours left on TRL's object


def test_repeated_rounds_of_one_step_get_their_own_shared_trace_alike_in_every_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Evaluation repeats its step number once per eval batch: each round its own trace, and a
    rank running the same schedule derives the same ones; the count kept stays bounded."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-7")
    monkeypatch.delenv("OTEL_ROLLOUT_RUN_ID", raising=False)
    monkeypatch.setattr(hook, "_rounds", {})

    def schedule(rank: str) -> list[int]:
        monkeypatch.setenv("RANK", rank)
        hook._rounds.clear()
        shared = [hook._shared(3, {}), hook._shared(3, {"validate": True})]
        shared += [hook._shared(3, {"validate": True})]
        assert all(s is not None and s.rank == int(rank) for s in shared)
        return [s.trace_id for s in shared if s is not None]

    rank0, rank1 = schedule("0"), schedule("1")
    assert rank0 == rank1 and len(set(rank0)) == 3
    for step in range(3 * hook.ROUNDS_KEPT):
        hook._shared(step, {})
    assert len(hook._rounds) == hook.ROUNDS_KEPT
