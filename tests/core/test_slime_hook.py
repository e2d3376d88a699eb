"""The slime hook's own decisions, without slime or Ray (the real layout — a Ray actor, the real
sglang-router, real SGLang servers — runs in tests/slime): the step is ``rollout_id``
(positional or keyword, as slime's drivers pass it), eval marked, a caller's step kept, no step
invented; and the seam it goes through, :mod:`otel_rollout.ray.actor_hooks`, reached the way
the Ray instrumentor's method wrapper reaches it, by the user class's name."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from otel_rollout import rollout_step
from otel_rollout.frameworks import slime
from otel_rollout.ray import actor_hooks
from otel_rollout.ray.instrumentor import _late_bound
from tests.conftest import OTelHarness

generate = dict(slime.HOOKS)["generate"]
evaluate = dict(slime.HOOKS)["eval"]


def steps(otel: OTelHarness) -> list[Any]:
    return [s for s in otel.finished_spans() if s.name == "rollout.step"]


def numbers(otel: OTelHarness) -> list[tuple[Any, Any]]:
    return [
        (s.attributes["rollout.step"], s.attributes.get("rollout.step.validate"))
        for s in steps(otel)
    ]


def test_a_rollout_is_its_rollout_id_and_eval_is_marked(otel: OTelHarness) -> None:
    assert generate(lambda rollout_id: rollout_id * 10, None, (3,), {}) == 30
    # train.py calls eval.remote(rollout_id=0) before training, eval.remote(rollout_id) later
    assert evaluate(lambda rollout_id: "done", None, (), {"rollout_id": 0}) == "done"
    assert numbers(otel) == [(3, None), (0, True)]


def test_no_rollout_id_no_step(otel: OTelHarness) -> None:
    assert generate(lambda: 1, None, (), {}) == 1
    assert generate(lambda rollout_id: 2, None, ("3",), {}) == 2  # not a step number
    assert generate(lambda rollout_id: 2, None, (True,), {}) == 2
    assert steps(otel) == []


def test_a_callers_own_step_is_kept(otel: OTelHarness) -> None:
    with rollout_step(40):
        generate(lambda rollout_id: None, None, (4,), {})
    assert [s.attributes["rollout.step"] for s in steps(otel)] == [40]


def test_slimes_exception_passes_through_unchanged(otel: OTelHarness) -> None:
    error = RuntimeError("engine gone")

    def failing(rollout_id: int) -> None:
        raise error

    with pytest.raises(RuntimeError) as raised:
        generate(failing, None, (5,), {})
    assert raised.value is error
    assert numbers(otel) == [(5, None)]


def test_an_async_method_is_its_step_until_it_returns(otel: OTelHarness) -> None:
    async def method(rollout_id: int) -> int:
        await asyncio.sleep(0)
        assert [s.attributes["rollout.step"] for s in steps(otel)] == []  # still open
        return rollout_id

    assert asyncio.run(generate(method, None, (6,), {})) == 6
    assert numbers(otel) == [(6, None)]


class RolloutManager:
    """Named as slime's class and module (the hook's key), defined here: no slime, no Ray."""

    def generate(self, rollout_id: int) -> str:
        return f"samples {rollout_id}"

    def save(self, rollout_id: int) -> str:
        return "saved"


RolloutManager.__module__ = "slime.ray.rollout"


class ModifiedClass(RolloutManager):
    """What Ray's ``_modify_class`` makes of it: a subclass naming the user's class."""

    __ray_actor_class__ = RolloutManager


def test_the_hook_runs_where_the_ray_wrapper_calls_the_users_method(otel: OTelHarness) -> None:
    instance = ModifiedClass()
    call = _late_bound(ModifiedClass, "generate")
    assert call is not None
    instrumentor = slime.SlimeInstrumentor()
    assert call(instance)(2) == "samples 2"  # not instrumented: the method alone
    instrumentor.instrument()
    try:
        assert call(instance)(7) == "samples 7"
        saved = _late_bound(ModifiedClass, "save")
        assert saved is not None and saved(instance)(7) == "saved"  # not a hooked method
    finally:
        instrumentor.uninstrument()
    assert call(instance)(8) == "samples 8"
    assert numbers(otel) == [(7, None)]


def test_registry_unregisters_only_its_own_hook() -> None:
    def first(*a: Any) -> None: ...
    def second(*a: Any) -> None: ...

    key = ("m", "C")
    actor_hooks.register("m", "C", "run", first)
    actor_hooks.register("m", "C", "run", second)  # a later owner replaces it
    actor_hooks.unregister("m", "C", "run", first)  # the earlier owner's undo is a no-op
    assert actor_hooks.hook_for(key, "run") is second
    actor_hooks.unregister("m", "C", "run", second)
    assert actor_hooks.hook_for(key, "run") is None
