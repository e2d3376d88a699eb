"""No data loss at RL batch sizes, and the same telemetry with the emitter on and off.

Before the background emitter, one ``LLM.generate`` of 8,192 prompts under
``opentelemetry-instrument`` with default SDK settings delivered 3,066 of 8,192 request spans: the
burst outran the BatchSpanProcessor's 2,048-span queue ("Queue full, dropping Span"). Here the
same call runs in a process of its own that exits right after the call, exporting over real OTLP
(testkit.otlp_receiver) with the SDK's defaults; every span and every count must arrive — and at
10× (81,920, engine-free: the instrumentor's own wrapper around real ``RequestOutput`` objects).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest

from otel_rollout import rollout_step
from testkit.burst_job import run_burst
from testkit.engines import vllm_telemetry
from testkit.otlp_receiver import OTLPReceiver, attr
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("queue", [262_144, 0], ids=["background", "inline"])
def test_every_record_of_a_10k_generate_arrives(
    queue: int, otel: OTelHarness, llm: Any, vllm_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    telemetry = vllm_telemetry()
    # Every span of the step is counted here, so step-aware sampling keeps them all (rate 1).
    monkeypatch.setattr(
        telemetry,
        "config",
        dataclasses.replace(telemetry.config, emit_queue=queue, sample_rate=1.0),
    )
    params = vllm_module.SamplingParams(max_tokens=2, ignore_eos=True)
    with rollout_step(1) as step:
        outputs = llm.generate(
            [f"emitter {queue} prompt {i}" for i in range(10_000)], params, use_tqdm=False
        )
    assert len(outputs) == 10_000
    # The step had every record and its ids when it ended, whether or not spans existed yet.
    assert step.stats is not None and step.stats.requests == 10_000

    spans = [s for s in otel.finished_spans() if s.attributes.get("gen_ai.response.id")]
    assert len(spans) == 10_000
    assert {s.attributes["gen_ai.response.id"] for s in spans} == {o.request_id for o in outputs}
    durations = otel.metric_points("gen_ai.server.request.duration")
    assert sum(p.count for p in durations) == 10_000
    output_tokens = [
        p
        for p in otel.metric_points("gen_ai.client.token.usage")
        if p.attributes["gen_ai.token.type"] == "output"
    ]
    assert sum(p.sum for p in output_tokens) == 20_000
    by_id = {s.context.span_id: s for s in spans}
    exemplars = [e for p in durations for e in p.exemplars]
    assert exemplars
    for exemplar in exemplars:
        span = by_id[exemplar.span_id]  # an exemplar names its own request's span
        assert exemplar.value == pytest.approx((span.end_time - span.start_time) / 1e9)
    stragglers = {s.span_id for s in step.stats.stragglers}
    assert stragglers <= {format(s.context.span_id, "016x") for s in spans}


def _run_job(
    receiver: OTLPReceiver, *args: str, timeout: float
) -> tuple[subprocess.CompletedProcess[str], float]:
    return run_burst(receiver.grpc_endpoint, *args, timeout=timeout, service="no-loss")


def _assert_all_arrived(receiver: OTLPReceiver, count: int, proc: Any) -> None:
    assert "Queue full" not in proc.stderr
    spans = [s for s in receiver.spans() if attr(s.attributes, "gen_ai.response.id") is not None]
    assert len(spans) == count
    assert len({attr(s.attributes, "gen_ai.response.id") for s in spans}) == count
    durations = [m for m in receiver.metrics() if m.name == "gen_ai.server.request.duration"]
    assert durations, "no metric export arrived"
    assert sum(p.count for p in durations[-1].histogram.data_points) == count  # cumulative
    request_ids = {(s.trace_id, s.span_id) for s in spans}
    exemplars = [e for m in durations for p in m.histogram.data_points for e in p.exemplars]
    assert exemplars and all((e.trace_id, e.span_id) in request_ids for e in exemplars)


def test_8192_prompt_generate_under_opentelemetry_instrument_loses_nothing(
    otlp_receiver: OTLPReceiver, tiny_model: str, vllm_module: Any
) -> None:
    proc, exit_s = _run_job(otlp_receiver, "--model", tiny_model, "--prompts", "8192", timeout=600)
    _assert_all_arrived(otlp_receiver, 8192, proc)
    print(f"8,192 prompts: exit took {exit_s:.1f} s after generate returned")


def test_81920_requests_under_opentelemetry_instrument_lose_nothing(
    otlp_receiver: OTLPReceiver, vllm_module: Any
) -> None:
    proc, exit_s = _run_job(otlp_receiver, "--standin", "81920", timeout=900)
    _assert_all_arrived(otlp_receiver, 81920, proc)
    print(f"81,920 requests: exit took {exit_s:.1f} s after generate returned")
