"""Preemptions on the real vLLM CPU engine (issue #12 item 1): a KV cache too small for the batch.

With room for only a few requests' tokens, vLLM's scheduler preempts running requests (evicts
their KV blocks, recomputes them later). Each request span must carry exactly the count vLLM
itself reports for that request (``RequestOutput.metrics.num_preemptions``), and the step the sum.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from otel_rollout import rollout_step
from testkit.engines import VLLM_KWARGS
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="session")
def small_kv(vllm_module: Any, tiny_model: str, instrumented: Any, llm: Any) -> Iterator[Any]:
    """Stats on, 4 KV-cache blocks (CPU blocks hold 128 tokens: 512 in all) for a batch that needs
    over 1,600 tokens at once."""
    engine = vllm_module.LLM(
        model=tiny_model,
        disable_log_stats=False,
        num_gpu_blocks_override=4,
        **{**VLLM_KWARGS, "max_model_len": 256},
    )
    # Kept for the session, like the other in-process engines: an LLM collected mid-session
    # tears down vLLM's process-wide parallel state under the engines still in use.
    yield engine


def test_each_request_carries_the_engines_own_preemption_count(
    otel: OTelHarness, small_kv: Any, vllm_module: Any
) -> None:
    lengths = [200] * 8
    params = [vllm_module.SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    with rollout_step(31) as step:
        outputs = small_kv.generate([f"q{i}" for i in range(8)], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == lengths
    engine = {o.request_id: o.metrics.num_preemptions for o in outputs}
    assert sum(engine.values()) > 0, "no preemption happened: the test tests nothing"
    spans = {
        s.attributes["gen_ai.response.id"]: s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.response.id") in engine
    }
    assert {rid: s.attributes["rollout.request.preemptions"] for rid, s in spans.items()} == engine
    (step_span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert step_span.attributes["rollout.step.preemptions"] == sum(engine.values())
    assert step.stats is not None and step.stats.preemptions == sum(engine.values())
