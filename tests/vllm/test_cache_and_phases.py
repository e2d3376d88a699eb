"""Prefix-cache hits and request phases on the real vLLM CPU engine (#12 items 1 and 2).

Prompts that share a long prefix (given as token ids, so the shared length is exact): after the
first request filled the cache, the others find the shared blocks. Each request span must carry
vLLM's own count (``RequestOutput.num_cached_tokens``) and the engine's own phase times
(``RequestOutput.metrics``: scheduled, first-token and last-token stamps); the step its sum and
rate, and the terminal summary their lines.
"""

from __future__ import annotations

from typing import Any

import pytest

from otel_rollout import rollout_step
from otel_rollout.reports.summary import format_summary
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm

SHARED = [(7 * i) % 1000 + 3 for i in range(640)]  # 5 CPU blocks of 128 tokens


def test_cached_tokens_and_phases_are_the_engines_own(
    otel: OTelHarness, llm_stats: Any, vllm_module: Any
) -> None:
    prompts = [{"prompt_token_ids": SHARED + [11 + i, 12 + i, 13 + i]} for i in range(6)]
    params = vllm_module.SamplingParams(max_tokens=24, ignore_eos=True)
    llm_stats.generate(prompts[:1], params, use_tqdm=False)  # fills the cache with the prefix
    with rollout_step(52) as step:
        outputs = llm_stats.generate(prompts, params, use_tqdm=False)
    engine_cached = {o.request_id: o.num_cached_tokens for o in outputs}
    assert sum(engine_cached.values()) >= 5 * 128, f"no prefix hit: {engine_cached}"
    spans = {
        s.attributes["gen_ai.response.id"]: s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.response.id") in engine_cached
    }
    assert {rid: s.attributes["rollout.usage.cached_tokens"] for rid, s in spans.items()} == (
        engine_cached
    )
    for out in outputs:
        m, attrs = out.metrics, spans[out.request_id].attributes
        assert attrs["rollout.request.prefill_time"] == pytest.approx(
            m.first_token_ts - m.scheduled_ts, abs=1e-6
        )
        assert attrs["rollout.request.decode_time"] == pytest.approx(
            m.last_token_ts - m.first_token_ts, abs=1e-6
        )
        names = [e.name for e in spans[out.request_id].events]
        assert names == ["rollout.scheduled", "gen_ai.first_token"]
    (step_span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    total_prompt = sum(len(o.prompt_token_ids) for o in outputs)
    assert step_span.attributes["rollout.step.cached_tokens"] == sum(engine_cached.values())
    assert step_span.attributes["rollout.step.cache_hit_rate"] == pytest.approx(
        sum(engine_cached.values()) / total_prompt
    )
    decode_max = max(o.metrics.last_token_ts - o.metrics.first_token_ts for o in outputs)
    assert step_span.attributes["rollout.step.decode_time.max_s"] == pytest.approx(
        decode_max, abs=1e-6
    )
    assert step.stats is not None
    text = format_summary(52, step.stats)
    assert "  request phases: queue p50 " in text and "  prefix cache: " in text
    print("\n" + text)
