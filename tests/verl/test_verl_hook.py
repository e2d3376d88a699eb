"""The verl step hook's contract, on verl's own ``auto_await`` facade and ``DataProto``.

verl's ``AgentLoopManager.generate_sequences`` is ``@auto_await async def``: a sync caller gets
the result, an async caller gets an awaitable, decided by verl from the calling frame. These tests
put the hook (``generate_sequences_wrapper``) in front of a method built with verl's real
decorator (the rollout itself is in test_verl_rollout.py) and check that each kind of caller still
gets what verl gives it, inside ``rollout.step`` = ``global_steps``; that a batch without
``global_steps`` gets no step; and that verl's exceptions pass through untouched.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import wrapt

from otel_rollout import current_step, rollout_step
from otel_rollout.frameworks import guarded
from otel_rollout.frameworks import verl as hook
from tests.conftest import OTelHarness

pytestmark = pytest.mark.verl


class VerlError(RuntimeError):
    pass


@pytest.fixture(scope="module")
def manager_class(verl_module: Any) -> type:
    """A class whose generate_sequences is built exactly like verl's (``@auto_await async def``),
    wrapped by the hook the way ``VerlInstrumentor`` wraps ``AgentLoopManager``."""
    from verl.utils.ray_utils import auto_await

    class Manager:
        @auto_await
        async def generate_sequences(self, prompts: Any) -> Any:
            await asyncio.sleep(0)
            if prompts.meta_info.get("fail"):
                raise VerlError("verl failed")
            step = current_step()
            prompts.meta_info["seen_step"] = step.step if step is not None else None
            return prompts

    Manager.generate_sequences = wrapt.FunctionWrapper(  # type: ignore[method-assign]
        Manager.__dict__["generate_sequences"], hook.generate_sequences_wrapper
    )
    return Manager


def batch(**meta: Any) -> Any:
    import numpy as np
    from verl.protocol import DataProto

    return DataProto.from_single_dict(
        {"raw_prompt": np.array(["a", "b"], dtype=object)}, meta_info=dict(meta)
    )


def steps(otel: OTelHarness) -> list[Any]:
    return [s for s in otel.finished_spans() if s.name == "rollout.step"]


def test_sync_caller_gets_the_result_inside_the_step(
    otel: OTelHarness, manager_class: type
) -> None:
    prompts = batch(global_steps=7)
    result = manager_class().generate_sequences(prompts)
    assert result is prompts and result.meta_info["seen_step"] == 7
    (span,) = steps(otel)
    assert span.attributes["rollout.step"] == 7 and "rollout.step.validate" not in span.attributes


def test_async_caller_still_gets_an_awaitable(otel: OTelHarness, manager_class: type) -> None:
    prompts = batch(global_steps=8, validate=True)

    async def trainer() -> Any:
        pending = manager_class().generate_sequences(prompts=prompts)
        assert asyncio.iscoroutine(pending)  # as verl's auto_await returns to an async caller
        return await pending

    result = asyncio.run(trainer())
    assert result is prompts and result.meta_info["seen_step"] == 8
    (span,) = steps(otel)
    assert span.attributes["rollout.step"] == 8 and span.attributes["rollout.step.validate"]


def test_sync_call_from_a_running_loop_still_blocks(otel: OTelHarness, manager_class: type) -> None:
    """verl's third case: a sync function called on a running loop gets the result."""
    prompts = batch(global_steps=9)

    def sync_helper() -> Any:
        return manager_class().generate_sequences(prompts)

    async def trainer() -> Any:
        return sync_helper()

    assert asyncio.run(trainer()) is prompts
    assert [s.attributes["rollout.step"] for s in steps(otel)] == [9]


@pytest.mark.parametrize(
    "meta",
    [
        {},
        {"global_steps": None},
        {"global_steps": "3"},
        {"global_steps": 2.5},
        {"global_steps": True},
    ],
)
def test_no_step_number_no_step(
    otel: OTelHarness, manager_class: type, meta: dict[str, Any]
) -> None:
    prompts = batch(**meta)
    assert manager_class().generate_sequences(prompts) is prompts
    assert prompts.meta_info["seen_step"] is None and steps(otel) == []


def test_callers_own_step_is_kept(otel: OTelHarness, manager_class: type) -> None:
    with rollout_step(40):
        result = manager_class().generate_sequences(batch(global_steps=4))
    assert result.meta_info["seen_step"] == 40
    assert [s.attributes["rollout.step"] for s in steps(otel)] == [40]


def test_verl_exception_passes_through_and_ends_the_step(
    otel: OTelHarness, manager_class: type
) -> None:
    with pytest.raises(VerlError, match="verl failed"):
        manager_class().generate_sequences(batch(global_steps=5, fail=True))

    async def trainer() -> Any:
        return await manager_class().generate_sequences(batch(global_steps=6, fail=True))

    with pytest.raises(VerlError, match="verl failed"):
        asyncio.run(trainer())
    assert sorted(
        (s.attributes["rollout.step"], s.attributes["error.type"]) for s in steps(otel)
    ) == [(5, "VerlError"), (6, "VerlError")]


def test_our_failure_leaves_verls_call_alone(
    otel: OTelHarness, manager_class: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FAKE FAULT: rollout_step replaced by one that raises (no real input makes ours fail)."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("ours")

    monkeypatch.setattr(guarded, "rollout_step", broken)
    prompts = batch(global_steps=11)
    assert manager_class().generate_sequences(prompts) is prompts
    assert prompts.meta_info["seen_step"] is None and steps(otel) == []


def test_instrumentor_patches_agent_loop_manager(verl_module: Any) -> None:
    from verl.experimental.agent_loop import AgentLoopManager

    instrumentor = hook.VerlInstrumentor()
    before = AgentLoopManager.__dict__["generate_sequences"]
    instrumentor.instrument()
    try:
        patched = AgentLoopManager.__dict__["generate_sequences"]
        assert isinstance(patched, wrapt.FunctionWrapper) and patched.__wrapped__ is before
    finally:
        instrumentor.uninstrument()
    assert AgentLoopManager.__dict__["generate_sequences"] is before
