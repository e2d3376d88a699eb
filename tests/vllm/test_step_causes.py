"""Why a step was slow, on the real vLLM engine (issue #42): a step with a planted cause.

Eighteen requests stop at 8 tokens; two must decode 160 (``ignore_eos``). The step waits for
them, and their time beyond the median length is what a cap at the median would have saved:
the step is length-bound, its tail (the two, after 90 % had finished) too, and the causes add
up to the step's duration.
"""

from __future__ import annotations

from typing import Any

import pytest

from otel_rollout import rollout_step
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm


def test_one_long_request_makes_the_step_length_bound(
    otel: OTelHarness, llm: Any, vllm_module: Any
) -> None:
    lengths = [8] * 18 + [160] * 2
    params = [vllm_module.SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    with rollout_step(42) as step:
        outputs = llm.generate([f"Question {i}:" for i in range(20)], params, use_tqdm=False)
    assert sorted(len(o.outputs[0].token_ids) for o in outputs) == sorted(lengths)
    assert step.stats is not None and step.stats.causes is not None
    causes = step.stats.causes
    assert causes.dominant == "length_bound"
    assert (causes.critical.output_tokens, causes.critical.median_output_tokens) == (160, 8)
    assert causes.critical.finish_reason == "length"
    # the causes are a partition of the step: they add up to its duration
    assert sum(causes.seconds.values()) == pytest.approx(step.stats.duration_s, rel=0.01)
    # the tail (after 90 % had finished: the two long ones) is mostly their extra decode
    assert step.stats.tail_requests == 2 and step.stats.tail_duration_s > 0
    assert sum(causes.tail.values()) == pytest.approx(step.stats.tail_duration_s, abs=1e-3)
    assert causes.tail["length_bound"] > 0.5 * step.stats.tail_duration_s
    # what if it had stopped at 90 %: the two long ones lost, the tail saved; a p95 cap is
    # their own length (2 of 20 are longer than 90 %), so it saves nothing
    whatif = step.stats.whatif
    assert whatif is not None
    at_90 = whatif.stops[0]
    assert (at_90.quantile, at_90.lost) == (0.9, 2)
    assert at_90.saved_s == pytest.approx(step.stats.tail_duration_s, abs=1e-6)
    assert [(c.tokens, c.truncated, c.saved_s) for c in whatif.caps] == [(160, 0, 0.0)] * 2
    (span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert span.attributes["rollout.step.whatif.stop_90.lost"] == 2
    assert span.attributes["rollout.step.cause.dominant"] == "length_bound"
    assert span.attributes["rollout.step.cause.length_bound_s"] == pytest.approx(
        causes.seconds["length_bound"], abs=1e-6
    )
    points = {
        p.attributes["rollout.cause"]: p for p in otel.metric_points("rollout.step.cause.duration")
    }
    assert points["length_bound"].count == 1
    assert points["length_bound"].sum == pytest.approx(causes.seconds["length_bound"])
