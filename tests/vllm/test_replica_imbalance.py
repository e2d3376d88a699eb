"""Replica imbalance on real vLLM (issue #42): two engines, one given three times the work.

Two ``AsyncLLM`` engines, each admitting at most 4 requests at once (``max_num_seqs=4``), serve
one step: engine a gets 4 requests, engine b 12 of the same length, so b decodes three waves
while a decodes one and then stands idle. Every request names its replica; the step's time
after a had finished is the step waiting on b alone (``replica_imbalance``, the dominant
cause); the balanced estimate (every replica ending at the mean of their ends) is checked
against real reruns of the same 16 requests, 8 and 8.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from otel_rollout import rollout_step
from otel_rollout.reports.summary import format_causes, format_whatif
from testkit.engines import VLLM_KWARGS, shutdown_async_llm
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm

TOKENS = 192
WAVE = 4
ROUNDS = 4


@pytest.fixture(scope="module")
def engines(
    vllm_module: Any, tiny_model: str, instrumented: Any, llm: Any, loop: asyncio.AbstractEventLoop
) -> Iterator[tuple[Any, Any]]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    async def start(cpu: int) -> Any:
        # each engine core on a core of its own, as replicas own their devices: a child
        # inherits the mask of the thread that spawns it (no core to spare: share them)
        os.sched_setaffinity(0, {cpu % len(cpus)})
        try:
            args = AsyncEngineArgs(model=tiny_model, max_num_seqs=WAVE, **VLLM_KWARGS)
            return AsyncLLM.from_engine_args(args)
        finally:
            os.sched_setaffinity(0, cpus)

    cpus = sorted(os.sched_getaffinity(0))
    pair = (loop.run_until_complete(start(0)), loop.run_until_complete(start(1)))
    yield pair
    for engine in pair:
        shutdown_async_llm(engine)


async def _one(engine: Any, params: Any, rid: str) -> int:
    outputs = [out async for out in engine.generate(f"Question {rid}:", params, request_id=rid)]
    return len(outputs[-1].outputs[0].token_ids)


def _step(
    step: int, split: tuple[int, int], engines: tuple[Any, Any], params: Any, loop: Any
) -> Any:
    async def run() -> list[int]:
        jobs = [
            _one(engine, params, f"s{step}-{name}-{i}")
            for engine, name, count in zip(engines, "ab", split, strict=True)
            for i in range(count)
        ]
        return list(await asyncio.gather(*jobs))

    with rollout_step(step) as scope:
        lengths = loop.run_until_complete(run())
    assert lengths == [TOKENS] * sum(split)
    return scope.stats


def _window(stats: Any) -> float:
    """The step's generation: its first arrival to its last finish (the latest replica's end)."""
    return max(load.end_s for load in stats.replicas.loads)


def test_one_replica_given_three_times_the_work(
    otel: OTelHarness, engines: tuple[Any, Any], vllm_module: Any, loop: Any
) -> None:
    from vllm.sampling_params import RequestOutputKind

    # only the final output per request: the driver (a third process on two cores) stays light
    params = vllm_module.SamplingParams(
        max_tokens=TOKENS, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
    )
    _step(0, (WAVE, WAVE), engines, params, loop)  # warm both engines
    lopsided, balanced = [], []
    for i in range(ROUNDS):
        lopsided.append(_step(1 + 2 * i, (WAVE, 3 * WAVE), engines, params, loop))
        balanced.append(_step(2 + 2 * i, (2 * WAVE, 2 * WAVE), engines, params, loop))

    for stats in lopsided:
        replicas, causes = stats.replicas, stats.causes
        assert replicas is not None and replicas.count == 2 and causes is not None
        assert [load.requests for load in replicas.loads] == [WAVE, 3 * WAVE]  # busiest last
        assert causes.critical.replica == replicas.busiest.replica
        # what the step waited on after the other replica's last finish, from the records
        assert causes.seconds["replica_imbalance"] == pytest.approx(replicas.spread_s, abs=2e-3)
        assert sum(causes.seconds.values()) == pytest.approx(stats.duration_s, rel=0.01)
        assert stats.whatif.balance is not None and stats.whatif.balance.fewest == 2
    # the planted cause dominates the lopsided steps (summed over the rounds: on two shared
    # cores one round's engines may run at uneven paces); the balanced reruns have far less of it
    lopsided_total = _total(lopsided)
    assert max(lopsided_total, key=lopsided_total.__getitem__) == "replica_imbalance"
    assert _total(balanced)["replica_imbalance"] < lopsided_total["replica_imbalance"] / 2

    # the estimate against the real balanced reruns of the same 16 requests. The model: the
    # work is the same however it is split, so balanced replicas all end at the mean of the
    # ends. An even split run for real still ends its two engines apart (0.04–0.25 s here:
    # two engines and the driver share two cores), so it is compared by its mean end — and
    # the saving of the rerun as it ran is printed beside it (docs/OUTPUTS.md has both)
    estimated = _mean(s.whatif.balance.saved_s for s in lopsided)
    balanced_end = _mean(_mean(load.end_s for load in s.replicas.loads) for s in balanced)
    measured = _mean(map(_window, lopsided)) - balanced_end
    as_run = _mean(map(_window, lopsided)) - _mean(map(_window, balanced))
    print("\n" + (format_causes(lopsided[0]) or ""), "\n" + (format_whatif(lopsided[0]) or ""))
    print(
        f"\nbalanced replicas, a step: estimated {estimated:.3f} s saved; measured "
        f"{measured:.3f} s (to the reruns' mean end), {as_run:.3f} s (to their last end)"
    )
    assert as_run > 0
    # 1.01–1.23× the measured saving over nine runs of this file on an idle two-core machine;
    # held to 35 % so that a busy machine's uneven paces do not fail it
    assert estimated == pytest.approx(measured, rel=0.35)

    # on the wire: each request span names its replica, the step span the spread and estimate
    first = lopsided[0]
    spans = otel.finished_spans()
    replicas_of = {
        s.attributes["rollout.replica"]
        for s in spans
        if s.name.startswith("text_completion") and s.attributes["rollout.step"] == 1
    }
    assert replicas_of == {load.replica for load in first.replicas.loads}
    (step_span,) = [
        s for s in spans if s.name == "rollout.step" and s.attributes["rollout.step"] == 1
    ]
    assert step_span.attributes["rollout.step.replicas"] == 2
    assert step_span.attributes["rollout.step.replica.spread_s"] == pytest.approx(
        first.replicas.spread_s
    )
    assert step_span.attributes["rollout.step.whatif.balanced.saved_s"] == pytest.approx(
        first.whatif.balance.saved_s, abs=1e-6
    )
    spread = otel.metric_points("rollout.step.replica.spread")
    assert sum(p.count for p in spread) == 1 + 2 * ROUNDS


def _mean(values: Iterable[float]) -> float:
    seq = list(values)
    return sum(seq) / len(seq)


def _total(steps: list[Any]) -> dict[str, float]:
    total: dict[str, float] = {}
    for stats in steps:
        for cause, seconds in stats.causes.seconds.items():
            total[cause] = total.get(cause, 0.0) + seconds
    return total
