"""Step-aware sampling (issue #19): the rule, a step's running state, and what the SDK receives.

The rule and the state are pure and tested on a long-tailed step of 2,000 requests whose
answer is known: every error, truncation and abort, the step's stragglers (its slowest) are
kept, and at most 10 % of the spans in all. Through a real ``Telemetry`` and the real SDK: the
metrics count every request, and every exemplar names a span that was exported. An agentic step
(requests starting throughout, its longest finishing mid-step) keeps its longest too, decided at
its end, and a provider's ``force_flush`` inside the step still delivers every record.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from otel_rollout.config import RolloutConfig, load_config
from otel_rollout.quantiles import tail_size
from otel_rollout.record import RequestRecord
from otel_rollout.sampling import SamplingPolicy, StepSampling, decide, rate_pick
from otel_rollout.semconv import STEP_SPAN_NAME
from otel_rollout.steps import StepScope
from otel_rollout.telemetry import Telemetry
from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.records import make_record
from tests.conftest import OTelHarness, flush_emitters

REPO = Path(__file__).resolve().parents[2]

POLICY = SamplingPolicy(tail=0.95)  # the rule at a tail of 5 %: its numbers below


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
    r = make_record("m", finish_reasons=("stop",))
    assert decide(r, POLICY, started=64, slow=False) == "all"
    assert decide(r, POLICY, 100, slow=True) == "tail"
    assert decide(r, POLICY, 100, False, rest_before=49) == "rate"  # the rest's 50th
    assert decide(r, POLICY, 100, False, rest_before=48) is None
    assert decide(make_record("m", finish_reasons=("length",)), POLICY, 100, False) == "truncated"
    assert decide(make_record("m", finish_reasons=("abort",)), POLICY, 100, False) == "error"
    assert decide(make_record("m", error=ValueError()), POLICY, 100, False) == "error"
    assert decide(r, SamplingPolicy(rate=1.0), 10_000, False) == "all"
    assert sum(rate_pick(n, 0.02) for n in range(20_000)) == 400  # exactly the share
    assert [n for n in range(200) if rate_pick(n, 0.02)] == [49, 99, 149, 199]  # evenly spread
    assert sum(rate_pick(n, 0.003) for n in range(10_000)) == 30


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


def _take_all(
    records: list[RequestRecord], started_at_once: bool, flush_every: int = 0
) -> tuple[list[RequestRecord], StepSampling]:
    """Every record through one open step's ``take`` (in finish order) and its end; returns
    what was handed on, in order. ``started_at_once``: a batch, else each starts at its arrival."""
    state = StepSampling(holds=True)
    out: list[RequestRecord] = []

    def submit(recs: Sequence[RequestRecord], parent: object) -> None:
        out.extend(recs)

    for r in records:
        r.span_id = r.span_id or random.Random(r.request_id).getrandbits(64) or 1  # as emitted
    if started_at_once:
        state.requests_started(len(records))
    arrivals = sorted(records, key=lambda r: r.arrival_ns)
    started = 0
    for i, r in enumerate(records, 1):
        while (
            not started_at_once
            and started < len(arrivals)
            and (arrivals[started].arrival_ns <= r.finish_ns)
        ):
            state.requests_started(1)
            started += 1
        for decided in state.take(r, None, submit, POLICY):  # type: ignore[arg-type]
            decided.submit((decided.record,), decided.parent)
        if flush_every and i % flush_every == 0:
            state.release()
    state.release(final=True)
    return out, state


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("flush_every", [0, 97])
def test_every_record_is_handed_on_exactly_once(seed: int, flush_every: int) -> None:
    """Whatever waits, is pushed out or loses its place: each record leaves the step once, with
    its decision (a dropped one without a span id)."""
    for records, at_once in (
        (_step("m", n=1000, seed=seed), True),
        (_agentic_step("m", n=1000, seed=seed), False),
    ):
        out, state = _take_all(records, at_once, flush_every)
        assert sorted(id(r) for r in out) == sorted(id(r) for r in records)
        assert state.waiting == 0
        assert all((r.kept is None) == (r.span_id == 0) for r in out)


def test_in_a_batch_the_slowest_places_add_nothing_and_in_an_agentic_step_keep_the_longest() -> (
    None
):
    batch = _step("m", n=1000)
    _take_all(batch, started_at_once=True)
    reasons = [r.kept for r in batch]
    assert "slowest" not in reasons  # the batch's longest finished last: its tail
    assert reasons.count("tail") == 50  # its last 5 %
    longest = sorted(batch, key=lambda r: r.finish_ns - r.arrival_ns)[-5:]
    assert all(r.kept == "tail" for r in longest)

    agentic = _agentic_step("m", n=1000, long=5)
    _take_all(agentic, started_at_once=False)
    longest = sorted(agentic, key=lambda r: r.finish_ns - r.arrival_ns)[-5:]
    assert all(r.kept is not None for r in longest)  # the 5 longest, whatever else kept them
    assert sum(r.kept is not None for r in agentic) <= 0.10 * len(agentic)


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
    assert reasons <= {"error", "truncated", "tail", "rate", "slowest"}


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


def _agentic_step(model: str, n: int = 400, long: int = 5, seed: int = 11) -> list[RequestRecord]:
    """Requests starting throughout 100 s, 1–3 s each, but ``long`` of them 30–50 s: they start
    early and finish mid-step, so neither the tail rule nor finish order finds them."""
    rng = random.Random(seed)
    t0 = time.time_ns()
    records = []
    for i in range(n):
        start = t0 + int(i / n * 100e9)
        latency = rng.uniform(30, 50) if i < long else rng.uniform(1, 3)
        records.append(
            make_record(
                model,
                request_id=f"a{i}",
                arrival_ns=start,
                scheduled_ns=start,
                first_token_ns=start + 1,
                finish_ns=start + int(latency * 1e9),
                finish_reasons=("stop",),
            )
        )
    return sorted(records, key=lambda r: r.finish_ns)


def _run_agentic(
    telemetry: Telemetry,
    records: list[RequestRecord],
    step_number: int,
    config: RolloutConfig | None = None,
) -> StepScope:
    """Each request starts and finishes in its step in the order of its times."""
    config = config or RolloutConfig()
    events = sorted(
        [(r.arrival_ns, 0, r) for r in records] + [(r.finish_ns, 1, r) for r in records],
        key=lambda e: (e[0], e[1]),
    )
    with StepScope(step_number, telemetry=telemetry, config=config) as step:
        for _, finished, r in events:
            if not finished:
                telemetry.requests_started(r.model, "text_completion", 1)
                continue
            r.span_id = 0  # the emitter draws them, as for a real request
            telemetry.emit(r)
            telemetry.requests_ended(r.model, "text_completion")
        waiting = step.sampling.waiting
    # waiting for the step's end: its tail window (the tail its analytics name, 10 % of those
    # started) and those of its 5 slowest places that no request kept anyway (the rate) holds
    tail = tail_size(len(records), config.tail_quantile)
    assert tail < waiting <= tail + 5
    assert step.sampling.waiting == 0
    return step


@pytest.mark.parametrize("queue", ["262144", "0"], ids=["background", "inline"])
def test_an_agentic_steps_longest_are_kept_at_its_end(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str, queue: str
) -> None:
    telemetry = make_telemetry(load_config({"OTEL_ROLLOUT_EMIT_QUEUE": queue}, warn=False))
    records = _agentic_step(model)
    longest = sorted(records, key=lambda r: r.finish_ns - r.arrival_ns)[-5:]
    assert all(records.index(r) < 0.9 * len(records) for r in longest)  # none in the tail
    step = _run_agentic(telemetry, records, 7)
    spans = [s for s in otel.finished_spans() if s.attributes.get("gen_ai.request.model") == model]
    requests = {s.attributes["gen_ai.response.id"]: s for s in spans if s.name != "rollout.step"}
    assert {r.request_id for r in longest} <= set(requests)  # the step's longest, all kept
    reasons = [s.attributes.get("rollout.sampling.reason") for s in requests.values()]
    assert 0 < reasons.count("slowest") <= 5
    # the tail, every 50th of the rest, the longest
    assert len(requests) <= tail_size(len(records), 0.9) + 0.02 * len(records) + 5
    print(f"\nagentic ({queue}): kept {len(requests)} of {len(records)}: {sorted(set(reasons))}")
    points = otel.metric_points("gen_ai.server.request.duration")
    assert sum(p.count for p in points) == len(records)  # every request, held ones included
    named = {e.span_id for p in points for e in p.exemplars}
    assert named <= {s.context.span_id for s in requests.values()}
    # the analysis names the kept spans' ids, never one that was not made
    assert step.stats is not None and step.stats.requests == len(records)
    made = {format(s.context.span_id, "016x") for s in requests.values()}
    assert {s.span_id for s in step.stats.stragglers} <= made
    for r in longest:  # each record carries its span's ids
        assert r.span_id == requests[r.request_id].context.span_id


@pytest.mark.parametrize("quantile", ["0.9", "0.8", "0.97"])
@pytest.mark.parametrize("shape", ["batch", "batch-out-of-order", "agentic"])
def test_every_request_of_the_tail_the_step_names_has_its_span(
    otel: OTelHarness,
    make_telemetry: Callable[..., Telemetry],
    model: str,
    quantile: str,
    shape: str,
) -> None:
    """Issue #40: "tail: 20 requests" must be 20 spans a user can open. One setting,
    OTEL_ROLLOUT_TAIL_QUANTILE, names the tail in the step's analytics and keeps its spans;
    the sampling's defaults otherwise (before, a 95 % sampling tail left a quarter of the
    analytics' 90 % tail without spans)."""
    config = load_config({"OTEL_ROLLOUT_TAIL_QUANTILE": quantile}, warn=False)
    telemetry = make_telemetry(config)
    if shape.startswith("batch"):
        records = _step(model, n=200)
        handed = list(records)
        if shape == "batch-out-of-order":
            # a stream's caller sees requests of one engine iteration in either order (seen on
            # real vLLM): every pair swapped
            for i in range(1, len(handed) - 1, 2):
                handed[i], handed[i + 1] = handed[i + 1], handed[i]
        with StepScope(3, telemetry=telemetry, config=config) as step:
            telemetry.requests_started(model, "text_completion", len(records))
            for r in handed:
                r.span_id = 0
                telemetry.emit(r)
    else:
        records = _agentic_step(model, n=200)
        step = _run_agentic(telemetry, records, 3, config)
    stats = step.stats
    assert stats is not None and stats.tail_quantile == float(quantile)
    tail = [r for r in records if r.finish_ns > stats.tail_start_ns]
    assert len(tail) == stats.tail_requests == tail_size(len(records), float(quantile))
    spans = {
        s.attributes["gen_ai.response.id"]: s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.request.model") == model and s.name != STEP_SPAN_NAME
    }
    assert {r.request_id for r in tail} <= set(spans)
    # each kept for what it is (the tail), unless something kept it first
    assert all(
        spans[r.request_id].attributes["rollout.sampling.reason"] in ("tail", "truncated", "error")
        for r in tail
    )


def test_without_the_slowest_rule_the_agentic_longest_are_lost(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str
) -> None:
    """The rule above is what keeps them: with OTEL_ROLLOUT_SAMPLE_SLOWEST=0 most are dropped."""
    telemetry = make_telemetry(load_config({"OTEL_ROLLOUT_SAMPLE_SLOWEST": "0"}, warn=False))
    records = _agentic_step(model)
    longest = {r.request_id for r in sorted(records, key=lambda r: r.finish_ns - r.arrival_ns)[-5:]}
    with StepScope(8, telemetry=telemetry, config=RolloutConfig()) as step:
        telemetry.requests_started(model, "text_completion", len(records))
        for r in records:
            r.span_id = 0
            telemetry.emit(r)
        assert step.sampling.waiting == tail_size(len(records), 0.9)  # the tail window only
    spans = otel.finished_spans()
    kept = {s.attributes.get("gen_ai.response.id") for s in spans} & longest
    assert len(kept) < len(longest)


def test_a_provider_flush_inside_the_step_delivers_the_held_records(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str
) -> None:
    """Standard OTel: ``force_flush`` delivers every record taken, so the step's candidates are
    decided then (kept); later ones are held again until the step's end."""
    telemetry = make_telemetry(load_config({}, warn=False))
    records = _agentic_step(model, n=300)
    first, rest = records[:200], records[200:]
    with StepScope(9, telemetry=telemetry, config=RolloutConfig()) as step:
        telemetry.requests_started(model, "text_completion", len(records))
        for r in first:
            r.span_id = 0
            telemetry.emit(r)
        # the tail window, and those of the 5 slowest places no request kept anyway holds
        waiting = step.sampling.waiting
        tail = tail_size(len(records), 0.9)
        assert tail < waiting <= tail + 5
        assert otel.tracer_provider.force_flush()
        assert otel.meter_provider.force_flush()
        assert step.sampling.waiting == 0
        exported = otel.spans.get_finished_spans()  # read directly: no flush of ours
        reasons = [s.attributes.get("rollout.sampling.reason") for s in exported]
        assert reasons.count("slowest") == waiting - tail and reasons.count("tail") == tail
        points = otel.metric_points("gen_ai.server.request.duration")
        assert sum(p.count for p in points) == len(first)
        for r in rest:
            r.span_id = 0
            telemetry.emit(r)
        assert step.sampling.waiting > 0
    points = otel.metric_points("gen_ai.server.request.duration")
    assert sum(p.count for p in points) == len(records)
    named = {e.span_id for p in points for e in p.exemplars}
    assert named <= {s.context.span_id for s in otel.finished_spans()}


_EXIT_IN_STEP_JOB = """
import sys
from testkit.otlp_job import sdk_over_otlp

sdk_over_otlp(sys.argv[1])

from otel_rollout.config import RolloutConfig
from otel_rollout.instrumentation import build_telemetry
from otel_rollout.sdk import bound_exit
from otel_rollout.steps import StepScope
from tests.core.test_sampling import _agentic_step

telemetry = build_telemetry("vllm", {})
bound_exit(telemetry.config.exit_timeout)  # what EngineInstrumentor.instrument() does
records = _agentic_step("exit-in-step")
step = StepScope(4, telemetry=telemetry, config=RolloutConfig()).__enter__()  # never left
for r in records:
    r.span_id = 0
    telemetry.requests_started(r.model, "text_completion", 1)
    telemetry.emit(r)
print("WAITING", step.sampling.waiting, flush=True)
"""


def test_exit_inside_an_open_step_delivers_what_waits(otlp_receiver: OTLPReceiver) -> None:
    """The process ends while its step is open: the waiting requests are decided at exit (kept),
    so every count and their spans arrive."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_IN_STEP_JOB, otlp_receiver.grpc_endpoint],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    waiting = int(proc.stdout.split("WAITING")[1].split()[0])
    assert waiting > 5, "nothing waited at exit: the test tests nothing"
    durations = [m for m in otlp_receiver.metrics() if m.name == "gen_ai.server.request.duration"]
    assert durations and sum(p.count for p in durations[-1].histogram.data_points) == 400
    reasons = [attr(s.attributes, "rollout.sampling.reason") for s in otlp_receiver.spans()]
    assert reasons.count("tail") + reasons.count("slowest") == waiting


def test_a_step_open_elsewhere_judges_its_tail_by_duration_where_requests_keep_arriving() -> None:
    """One Ray call a sample: requests arrive one after another and finish fast, so at each
    finish the requests started are barely more than those done. Judged by finish order alone
    every one looked like the tail (all 4,096 spans of a measured step were kept); with the
    duration too, the tail share is about what the policy says, and the longest are in it."""
    rng = random.Random(3)
    state = StepSampling()
    records = []
    t = time.time_ns()
    for i in range(2000):
        latency = int(rng.paretovariate(2.0) * 1e7)
        records.append(
            make_record(
                "m",
                request_id=f"a{i}",
                arrival_ns=t,
                finish_ns=t + latency,
                finish_reasons=("stop",),
            )
        )
        t += 10**6
    kept: dict[str, str | None] = {}
    for r in records:  # each started, then finished, before the next started
        state.requests_started(1)
        kept[r.request_id] = state.decide(r, POLICY)
    reasons = Counter(kept.values())
    assert reasons["tail"] <= 0.05 * len(records) + 64, reasons  # ~the policy's 5 %
    assert sum(v is not None for v in kept.values()) <= 0.10 * len(records), reasons
    longest = sorted(records, key=lambda r: r.finish_ns - r.arrival_ns)[-20:]
    assert all(kept[r.request_id] is not None for r in longest)


def test_a_ray_actor_samples_its_share_of_a_drivers_step(
    otel: OTelHarness, make_telemetry: Callable[..., Telemetry], model: str
) -> None:
    """In a Ray actor the driver's step is a stand-in (``RemoteStep``): its requests are
    sampled there at once, as a step open in another process is, and every record still goes
    home to the driver's step. (Before, the stand-in hid the step from sampling: every span of
    verl's server actors was made.)"""
    from opentelemetry import context as otel_context

    from otel_rollout.context import with_step
    from otel_rollout.ray.steps import LOCAL, RemoteStep

    telemetry = make_telemetry(load_config({}, warn=False))
    records = _step(model, n=400)
    key = "ray-step-key-under-test"
    token = otel_context.attach(with_step(RemoteStep(key, 12), otel_context.get_current()))
    try:
        telemetry.requests_started(model, "text_completion", len(records))
        for r in records:
            r.span_id = 0
            telemetry.emit(r)
    finally:
        otel_context.detach(token)
    flush_emitters()
    spans = [
        s
        for s in otel.finished_spans()
        if s.attributes.get("gen_ai.request.model") == model and s.name != STEP_SPAN_NAME
    ]
    reasons = Counter(s.attributes["rollout.sampling.reason"] for s in spans)
    assert len(spans) <= 0.16 * len(records), reasons  # the tail, every 50th, truncations
    truncated = sum(1 for r in records if r.finish_reason == "length")
    assert reasons["truncated"] == truncated and reasons["tail"] >= 0.09 * len(records)
    assert all(s.attributes["rollout.step"] == 12 for s in spans)
    home = LOCAL.take(key).records  # what the actor sends to the driver's step: every request
    assert len(home) == len(records)
    points = otel.metric_points("gen_ai.server.request.duration")
    assert sum(p.count for p in points) == len(records)


@pytest.mark.parametrize("open_here", [True, False])
def test_a_step_of_truncations_keeps_its_tails_worth_of_them_at_once(
    model: str, open_here: bool
) -> None:
    """Every request truncated (``max_tokens`` too short for the step): a span for each was no
    sampling at all. As many truncations as the tail holds are kept at once; the rest are
    sampled as any request is (its tail, the rate, the longest) — every one still decided once."""
    records = _step(model, n=2000, seed=3)
    for r in records:
        r.error, r.finish_reasons = None, ("length",)
    budget = tail_size(len(records), POLICY.tail)  # 100: the tail's size
    if open_here:
        out, _ = _take_all(records, started_at_once=True)
        assert sorted(r.request_id for r in out) == sorted(r.request_id for r in records)
        reasons = Counter(r.kept for r in out)
    else:
        state = StepSampling()
        state.requests_started(len(records))
        reasons = Counter(state.decide(r, POLICY) for r in records)
    assert reasons["truncated"] == budget
    tail = records[int(POLICY.tail * len(records)) :]  # finished after 95 % had: all kept
    if open_here:
        kept_ids = {r.request_id for r in out if r.kept is not None}
        assert {r.request_id for r in tail} <= kept_ids
    kept = sum(v for k, v in reasons.items() if k is not None)
    assert kept <= 2 * budget + 0.02 * len(records) + POLICY.slowest + 1, reasons
    assert reasons[None] >= 0.85 * len(records)


def test_truncations_within_the_budget_are_all_kept(model: str) -> None:
    """1 % truncated (RL's usual share, under the tail's 5 %): every one keeps its span."""
    records = _step(model)
    state = StepSampling()
    state.requests_started(len(records))
    kept = {r.request_id: state.decide(r, POLICY) for r in records}
    truncated = [r for r in records if r.finish_reason == "length" and r.error is None]
    assert truncated and all(kept[r.request_id] is not None for r in truncated)
