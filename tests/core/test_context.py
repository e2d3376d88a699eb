"""Where a request finds its step: the context's view, looked up once per context object."""

from __future__ import annotations

import gc
import weakref

from opentelemetry import baggage
from opentelemetry import context as otel_context

from otel_rollout.context import step_view, with_step, with_trajectory
from otel_rollout.record import RequestRecord, TrajectoryRecord


class Step:
    """A step collector as the emitter sees one (the protocol's three calls)."""

    def __init__(self, number: int | None) -> None:
        self.step = number
        self.records: list[RequestRecord] = []

    def observe(self, record: RequestRecord) -> None:
        self.records.append(record)

    def observe_trajectory(self, trajectory: TrajectoryRecord) -> None:
        pass

    def requests_started(self, count: int) -> None:
        pass


def test_the_view_of_each_context_is_its_own() -> None:
    root = otel_context.Context()
    step = Step(7)
    in_step = with_step(step, root)
    trajectory = Step(None)
    in_turn = with_trajectory(trajectory, in_step)
    remote = baggage.set_baggage("rollout.step", "12", root)

    assert step_view(in_step) == (step, 7, (step,))
    assert step_view(in_turn) == (step, 7, (step, trajectory))
    assert step_view(remote) == (None, 12, ())
    assert step_view(root) == (None, None, ())
    assert step_view(in_step) == (step, 7, (step,))  # asked again after others: still its own


def test_the_same_context_is_looked_up_once() -> None:
    """A stream asks at its start and its end, every request of a step in the same context."""
    ctx = with_step(Step(3), otel_context.Context())
    assert step_view(ctx) is step_view(ctx)
    token = otel_context.attach(ctx)
    try:
        assert step_view() is step_view(ctx)  # the current context by default
    finally:
        otel_context.detach(token)


def test_the_remembered_view_keeps_no_step_alive() -> None:
    step = Step(5)
    ctx = with_step(step, otel_context.Context())
    assert step_view(ctx).step is step
    gone = weakref.ref(step)
    del step, ctx
    gc.collect()
    assert gone() is None
