"""Speculative decoding on the real vLLM CPU engine (issue #12 items 1-2): the n-gram speculator.

vLLM's n-gram speculator proposes draft tokens by matching the prompt's own n-grams, so it needs
no draft model and runs on CPU. With ``per_request_spec_decode_metrics`` each sequence carries
vLLM's own per-request counts (``RequestSpecDecodeMetrics``); with stats on, each iteration's
``SpecDecodingStats`` reaches our stat logger. Spans must carry the former exactly, and the step
the latter, which must add up to the same totals: two independent paths through the engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from otel_rollout import rollout_step
from testkit.workload_runner import REPO, workload_env
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm


def test_draft_and_accepted_tokens_are_the_engines_own(tiny_model: str, vllm_module: Any) -> None:
    """In a process of its own (see tests/vllm/spec_job.py for why)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.vllm.spec_job", "--model", tiny_model],
        env=workload_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    job = json.loads(line)
    engine = {}
    for rid, m in job["engine"].items():
        assert m is not None, "vLLM reported no per-request speculative decoding"
        accepted = sum(j * n for j, n in enumerate(m["histogram"]))
        assert m["rate"] == pytest.approx(accepted / m["drafted"])  # vLLM's own payload agrees
        engine[rid] = [m["drafted"], accepted]
    drafted = sum(d for d, _ in engine.values())
    accepted_total = sum(a for _, a in engine.values())
    assert drafted > 0 and accepted_total > 0, f"nothing drafted or accepted: {engine}"
    spans = {
        s["attributes"]["gen_ai.response.id"]: s["attributes"]
        for s in job["spans"]
        if s["attributes"].get("gen_ai.response.id") in engine
    }
    assert {
        rid: [
            a["rollout.request.spec_decode.draft_tokens"],
            a["rollout.request.spec_decode.accepted_tokens"],
        ]
        for rid, a in spans.items()
    } == engine
    # the stat logger's path: each iteration's SpecDecodingStats, summed over the step
    step_drafted, step_accepted, step_rate = job["step_engine"]
    assert (step_drafted, step_accepted) == (drafted, accepted_total)
    assert step_rate == pytest.approx(accepted_total / drafted)
    (step_span,) = [s["attributes"] for s in job["spans"] if s["name"] == "rollout.step"]
    assert step_span["rollout.step.engine.spec_decode.draft_tokens"] == drafted
    assert step_span["rollout.step.engine.spec_decode.acceptance_rate"] == pytest.approx(
        accepted_total / drafted
    )


def test_without_speculative_decoding_the_figures_are_absent(
    otel: OTelHarness, llm_stats: Any, vllm_module: Any
) -> None:
    """No speculator: no per-request count and no step figure, never a made-up 0."""
    params = vllm_module.SamplingParams(max_tokens=8, ignore_eos=True)
    with rollout_step(42) as step:
        llm_stats.generate(["one two one two"], params, use_tqdm=False)
    (span,) = [s for s in otel.finished_spans() if s.attributes.get("gen_ai.response.id")]
    assert "rollout.request.spec_decode.draft_tokens" not in span.attributes
    assert step.stats is not None and step.stats.engine is not None
    assert step.stats.engine.spec_draft_tokens is None
    (step_span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert not any(k.startswith("rollout.step.engine.spec_decode") for k in step_span.attributes)
