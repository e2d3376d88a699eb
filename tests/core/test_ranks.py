"""The ranks of a job put one step in one trace (:mod:`otel_rollout.ranks`): the run id read as a
launcher gives it, ids derived alike in every rank, rank 0's step span the root."""

from __future__ import annotations

import pytest
from opentelemetry import trace

from otel_rollout import rollout_step
from otel_rollout.ranks import job_ranks, shared_step
from tests.conftest import OTelHarness

TORCHRUN = {"WORLD_SIZE": "2", "RANK": "1", "TORCHELASTIC_RUN_ID": "3c1d-run"}


def test_the_rank_and_run_as_torchrun_gives_them() -> None:
    ranks = job_ranks(None, TORCHRUN)
    assert ranks is not None and (ranks.run_id, ranks.rank, ranks.world) == ("3c1d-run", 1, 2)
    assert job_ranks("my-run", TORCHRUN).run_id == "my-run"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "environ",
    [
        {},  # one process
        {"WORLD_SIZE": "1", "RANK": "0", "TORCHELASTIC_RUN_ID": "x"},
        {"WORLD_SIZE": "2", "RANK": "0"},  # no run id: nothing tells this run from the next
        {"WORLD_SIZE": "2", "RANK": "0", "TORCHELASTIC_RUN_ID": "none"},  # torchrun's default
        {"WORLD_SIZE": "two", "RANK": "0", "TORCHELASTIC_RUN_ID": "x"},
        {"WORLD_SIZE": "2", "RANK": "2", "TORCHELASTIC_RUN_ID": "x"},
    ],
)
def test_no_shared_trace_without_ranks_and_a_run_id(environ: dict[str, str]) -> None:
    assert job_ranks(None, environ) is None


def test_every_rank_derives_the_same_ids_and_each_step_and_run_its_own() -> None:
    rank0 = job_ranks(None, {**TORCHRUN, "RANK": "0"})
    rank1 = job_ranks(None, TORCHRUN)
    assert rank0 is not None and rank1 is not None
    a, b = shared_step(rank0, "3/train/0"), shared_step(rank1, "3/train/0")
    assert (a.trace_id, a.root_span_id) == (b.trace_id, b.root_span_id)
    assert (a.rank, b.rank, a.ranks) == (0, 1, 2)
    other_round = shared_step(rank0, "3/train/1")
    other_run = shared_step(rank0._replace(run_id="another"), "3/train/0")
    assert len({a.trace_id, other_round.trace_id, other_run.trace_id}) == 3
    assert 0 < a.trace_id < 2**128 and 0 < a.root_span_id < 2**64


def test_rank_zeros_step_is_the_root_and_another_ranks_its_child(otel: OTelHarness) -> None:
    ranks = job_ranks(None, TORCHRUN)
    assert ranks is not None
    for rank in (1, 0):  # either may start first
        shared = shared_step(ranks._replace(rank=rank), "5/train/0")
        with rollout_step(5, shared=shared):
            inside = trace.get_current_span().get_span_context()
            assert inside.trace_id == shared.trace_id
    spans = {s.attributes["rollout.step.rank"]: s for s in otel.finished_spans()}
    zero, one = spans[0], spans[1]
    assert zero.context.trace_id == one.context.trace_id == shared.trace_id
    assert zero.context.span_id == shared.root_span_id and zero.parent is None
    assert one.parent is not None and one.parent.span_id == shared.root_span_id
    assert zero.attributes["rollout.step.ranks"] == one.attributes["rollout.step.ranks"] == 2
    assert zero.attributes["rollout.step"] == 5
    with rollout_step(6):  # an unshared step after it: ids of its own again
        pass
    last = [s for s in otel.finished_spans() if s.attributes.get("rollout.step") == 6][0]
    assert last.context.trace_id != shared.trace_id and "rollout.step.rank" not in last.attributes
