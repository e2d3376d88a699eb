"""Step-aware sampling (issue #19): the rule, a step's running state, and what the SDK receives.

The rule and the state are pure and tested on a long-tailed step of 2,000 requests whose
answer is known: every error, truncation and abort, the step's stragglers (its slowest) are
kept, and at most 10 % of the spans in all. Through a real ``Telemetry`` and the real SDK: the
metrics count every request, and every exemplar names a span that was exported.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from otel_rollout.config import RolloutConfig, load_config
from otel_rollout.record import RequestRecord
from otel_rollout.sampling import SamplingPolicy, StepSampling, decide, rate_pick
from otel_rollout.steps import StepScope
from otel_rollout.telemetry import Telemetry
from testkit.records import make_record
from tests.conftest import OTelHarness

POLICY = SamplingPolicy()


def _step(model: str, n: int = 2000, seed: int = 7) -> list[RequestRecord]:
    """A batch submitted at once, lengths long-tailed, in finishing order; 1 % truncated, two
    errors, one abort."""
    rng = random.Random(seed)
    t0 = time.time_ns()
    records = []
    for i in range(n):
        latency = int(rng.paretovariate(1.5) * 1e9)
        reason = "length" if i % 100 == 0 else "stop"
        records.append(
            make_record(
                model,
                request_id=f"r{i}",
                arrival_ns=t0,
                scheduled_ns=t0,
                first_token_ns=t0 + 1,
                finish_ns=t0 + latency,
                finish_reasons=(reason,),
                span_id=rng.getrandbits(64),
            )
        )
    records[5].error = RuntimeError("engine failed")
    records[17].error = RuntimeError("engine failed")
    records[23].finish_reasons = ("abort",)
    return sorted(records, key=lambda r: r.finish_ns)


def test_the_rule() -> None:
    r = make_record("m", finish_reasons=("stop",), span_id=1)  # low id: picked at any rate > 0
    assert decide(r, POLICY, started=64, done_before=0) == "all"
    assert decide(r, POLICY, 100, 95) == "tail"
    assert decide(r, POLICY, 100, 94) == "rate"
    high = make_record("m", finish_reasons=("stop",), span_id=(1 << 48) - 1)
    assert decide(high, POLICY, 100, 94) is None
    assert decide(make_record("m", finish_reasons=("length",)), POLICY, 100, 0) == "truncated"
    assert decide(make_record("m", finish_reasons=("abort",)), POLICY, 100, 0) == "error"
    assert decide(make_record("m", error=ValueError()), POLICY, 100, 0) == "error"
    assert decide(high, SamplingPolicy(rate=1.0), 10_000, 0) == "all"
    ids = random.Random(1).getrandbits
    assert 0.015 < sum(rate_pick(ids(64), 0.02) for _ in range(20_000)) / 20_000 < 0.025


def test_a_long_tailed_step_keeps_what_matters_and_little_else(model: str) -> None:
    records = _step(model)
    state = StepSampling()
    state.requests_started(len(records))
    kept = {r.request_id: state.decide(r, POLICY) for r in records}
    n = len(records)
    share = sum(v is not None for v in kept.values()) / n
    assert share <= 0.10, share
    slowest = sorted(records, key=lambda r: r.finish_ns - r.arrival_ns)[-20:]
    assert all(kept[r.request_id] is not None for r in slowest)  # submitted together
    tail = records[int(POLICY.tail * n) :]  # finished after 95 % had
    assert all(kept[r.request_id] is not None for r in tail)
    special = [r for r in records if r.error is not None or r.finish_reason in ("length", "abort")]
    assert len(special) == 23 and all(kept[r.request_id] is not None for r in special)
    print(f"\nkept {share:.1%} of {n}: {sorted(set(map(str, kept.values())))}")


def test_through_the_sdk_metrics_count_all_and_exemplars_name_exported_spans(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str
) -> None:
    telemetry = make_telemetry(load_config({}, warn=False))  # the defaults: rate 0.02
    records = _step(model, n=400)
    for r in records:
        r.span_id = 0  # the emitter draws them, as for a real request
    with StepScope(5, telemetry=telemetry, config=RolloutConfig()) as step:
        telemetry.requests_started(model, "text_completion", len(records))
        for r in records:
            telemetry.emit(r)
            telemetry.requests_ended(model, "text_completion")
    spans = [s for s in otel.finished_spans() if s.attributes.get("gen_ai.request.model") == model]
    requests = [s for s in spans if s.name != "rollout.step"]
    assert 0 < len(requests) <= 0.10 * len(records) + 23
    exported = {s.context.span_id for s in requests}
    points = otel.metric_points("gen_ai.server.request.duration")  # by finish reason, error
    assert sum(p.count for p in points) == len(records)  # every request, sampled or not
    named = {e.span_id for p in points for e in p.exemplars}
    assert named and named <= exported  # a click on a bucket never leads nowhere
    assert step.stats is not None and step.stats.requests == len(records)  # analysis sees all
    reasons = {s.attributes.get("rollout.sampling.reason") for s in requests}
    assert reasons <= {"error", "truncated", "tail", "rate"}


@pytest.mark.parametrize("rate", ["1", "1.0"])
def test_rate_one_keeps_every_span(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str, rate: str
) -> None:
    telemetry = make_telemetry(load_config({"OTEL_ROLLOUT_SAMPLE_RATE": rate}, warn=False))
    records = _step(model, n=200)
    for r in records:
        r.span_id = 0
    with StepScope(6, telemetry=telemetry, config=RolloutConfig()):
        telemetry.requests_started(model, "text_completion", len(records))
        for r in records:
            telemetry.emit(r)
    spans = [
        s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.request.model") == model and s.name != "rollout.step"
    ]
    assert len(spans) == len(records)
    assert not any("rollout.sampling.reason" in s.attributes for s in spans)
