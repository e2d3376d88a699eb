"""``Engine(enable_metrics=True)``: spans carry SGLang's own timeline, to the nanosecond."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from otel_rollout import rollout_step
from tests.conftest import OTelHarness
from tests.sglang.conftest import start_engine
from tests.sglang.helpers import assert_matches, in_flight, params, spans_by_id

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def engine_metrics(sglang_module: Any, tiny_model: str, instrumented: Any) -> Iterator[Any]:
    eng = start_engine(sglang_module, tiny_model, enable_metrics=True)
    yield eng
    eng.shutdown()


def _assert_engine_timeline(span: Any, meta: dict[str, Any]) -> None:
    """Start, end, first token and queue time are SGLang's stamps, converted once."""
    start = int(meta["request_received_ts"] * 1e9)
    assert span.attributes["rollout.timing.source"] == "engine"
    assert span.start_time == start
    assert span.end_time == start + int(meta["e2e_latency"] * 1e9)
    (event,) = [e for e in span.events if e.name == "gen_ai.first_token"]
    assert event.timestamp == start + int(meta["first_token_latency"] * 1e9)
    assert span.attributes["rollout.request.time_to_first_token"] == pytest.approx(
        meta["first_token_latency"], abs=1e-8
    )
    queue = meta["forward_entry_time"] - meta["request_received_ts"]
    assert span.attributes["rollout.request.queue_time"] == pytest.approx(max(0.0, queue), abs=1e-6)
    # the same three phases as vLLM's: queue, prefill (scheduled → first token), decode
    assert span.attributes["rollout.request.prefill_time"] == pytest.approx(
        max(0.0, meta["first_token_latency"] - queue), abs=1e-6
    )
    assert span.attributes["rollout.request.decode_time"] == pytest.approx(
        meta["e2e_latency"] - meta["first_token_latency"], abs=1e-6
    )
    assert [e.name for e in span.events] == ["rollout.scheduled", "gen_ai.first_token"]


def test_engine_timeline_batch_and_stream(otel: OTelHarness, engine_metrics: Any) -> None:
    lengths = [3, 12, 6]
    outs = engine_metrics.generate(
        prompt=[f"q{i}" for i in range(3)], sampling_params=[params(n) for n in lengths]
    )

    async def stream() -> tuple[int, dict[str, Any]]:
        gen = await engine_metrics.async_generate(
            prompt="s =", stream=True, sampling_params=params(5)
        )
        count, last = 0, {}
        async for chunk in gen:
            count, last = len(chunk["output_ids"]), chunk
        return count, last

    streamed, last = engine_metrics.loop.run_until_complete(stream())

    by_id = spans_by_id(otel)
    assert len(by_id) == 4
    for out, n in zip(outs, lengths, strict=False):
        span = by_id[out["meta_info"]["id"]]
        assert_matches(span, out, n)
        _assert_engine_timeline(span, out["meta_info"])
    span = by_id[last["meta_info"]["id"]]
    assert_matches(span, last, streamed)
    _assert_engine_timeline(span, last["meta_info"])

    for name in (
        "rollout.request.queue_time",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.request.duration",
    ):
        assert sum(p.count for p in otel.metric_points(name)) == 4, name
    tpot = otel.metric_points("gen_ai.server.time_per_output_token")
    assert sum(p.count for p in tpot) == 4
    assert in_flight(otel) == 0


def test_prefix_cache_hits_are_the_engines_own(otel: OTelHarness, engine_metrics: Any) -> None:
    """Prompts sharing 600 token ids: SGLang's radix cache serves the prefix after the first;
    each span carries SGLang's ``cached_tokens``, the step their sum and rate."""
    shared = [(7 * i) % 1000 + 3 for i in range(600)]
    prompts = [shared + [11 + i, 12 + i] for i in range(5)]
    engine_metrics.generate(input_ids=prompts[:1], sampling_params=params(4))
    with rollout_step(61) as step:
        outs = engine_metrics.generate(input_ids=prompts, sampling_params=params(4))
    cached = {o["meta_info"]["id"]: o["meta_info"]["cached_tokens"] for o in outs}
    assert sum(cached.values()) >= 4 * 500, f"no prefix hit: {cached}"
    by_id = spans_by_id(otel)
    assert {rid: by_id[rid].attributes["rollout.usage.cached_tokens"] for rid in cached} == cached
    (step_span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    prompt_tokens = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    assert step_span.attributes["rollout.step.cached_tokens"] == sum(cached.values())
    assert step_span.attributes["rollout.step.cache_hit_rate"] == pytest.approx(
        sum(cached.values()) / prompt_tokens
    )
    assert step.stats is not None and step.stats.cache is not None
    assert step.stats.request_phases is not None and step.stats.request_phases.decode is not None


def _sglang_counters() -> dict[str, float]:
    """SGLang's own counters as a scrape of its multiprocess directory reads them (every file,
    the collector's full merge: independent of our reader)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
    names = ("sglang:prompt_tokens_total", "sglang:generation_tokens_total")
    totals = dict.fromkeys(names, 0.0)
    for family in registry.collect():
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals


def test_step_engine_figures_are_sglangs_own(otel: OTelHarness, engine_metrics: Any) -> None:
    """SGLang's scheduler figures over a step, read from its metrics collectors' files: tokens
    equal the deltas of its own counters, the queue and KV-pool gauges were seen while it ran."""
    from otel_rollout.reports.summary import format_summary

    lengths = [40, 80, 120, 160, 200, 240, 280, 320]
    before = _sglang_counters()
    with rollout_step(63) as step:
        outs = engine_metrics.generate(
            [f"Write a long story, number {i}" for i in range(len(lengths))],
            [{"max_new_tokens": n, "ignore_eos": True} for n in lengths],
        )
    delta = {k: v - before[k] for k, v in _sglang_counters().items()}
    assert [o["meta_info"]["completion_tokens"] for o in outs] == lengths
    e = step.stats.engine
    assert e is not None and e.source == "sampled"
    assert e.generation_tokens == sum(lengths) == delta["sglang:generation_tokens_total"]
    prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
    assert e.prompt_tokens == prompt == delta["sglang:prompt_tokens_total"]
    # read when the step opened, each second, when it ended: how many depends on how fast this
    # machine ran the step; that some read came while it ran shows in the gauges (0 before and
    # after: nothing running, nothing in the pool)
    assert e.iterations >= 2
    assert 1 <= e.running_peak <= len(lengths), "not read while the step ran"
    assert 0 < e.kv_cache_usage_peak <= 1
    (span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert span.attributes["rollout.step.engine.source"] == "sampled"
    assert span.attributes["rollout.step.engine.generation_tokens"] == sum(lengths)
    points = otel.metric_points("rollout.step.engine.kv_cache_usage")
    assert sorted(p.attributes["rollout.statistic"] for p in points) == ["mean", "peak"]
    text = format_summary(63, step.stats)
    assert "reads | KV cache peak" in text
    print("\n" + text)


# SGLang admits a request when its prompt plus min(max_new_tokens, this) fits the KV pool, and
# reserves this ratio of the running requests' remaining tokens: both low, it admits more than
# fits and must retract (free a request's KV and recompute it later) while they decode.
RETRACTING = {"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": "4", "SGLANG_INIT_NEW_TOKEN_RATIO": "0.001"}


@pytest.fixture(scope="module")
def small_pool_engine(sglang_module: Any, tiny_model: str, instrumented: Any) -> Iterator[Any]:
    """A 256-token KV pool for 8 requests of ~160 tokens, with an optimistic scheduler."""
    saved = {k: os.environ.get(k) for k in RETRACTING}
    os.environ.update(RETRACTING)  # read by the scheduler process at its start
    try:
        eng = start_engine(
            sglang_module,
            tiny_model,
            max_total_tokens=256,
            schedule_conservativeness=0.001,
            # num_retractions is in meta_info with metrics off too; and a second engine with
            # metrics on in one process collides in prometheus_client's registry
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield eng
    eng.shutdown()


def test_retractions_are_the_requests_preemptions(
    otel: OTelHarness, small_pool_engine: Any
) -> None:
    """Each span's ``rollout.request.preemptions`` is SGLang's own ``num_retractions`` for that
    request; the step's is their sum."""
    prompts = [f"Tell me a story number {i}" for i in range(8)]
    with rollout_step(62) as step:
        outs = small_pool_engine.generate(
            prompts, {"max_new_tokens": 150, "ignore_eos": True, "temperature": 0}
        )
    retractions = {o["meta_info"]["id"]: o["meta_info"]["num_retractions"] for o in outs}
    assert sum(retractions.values()) > 0, "the engine retracted nothing: the test tests nothing"
    by_id = spans_by_id(otel)
    spans = {rid: by_id[rid].attributes["rollout.request.preemptions"] for rid in retractions}
    assert spans == retractions
    (step_span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert step_span.attributes["rollout.step.preemptions"] == sum(retractions.values())
    assert step.stats is not None and step.stats.preemptions == sum(retractions.values())
    points = otel.metric_points("rollout.step.preemptions")
    assert [p.sum for p in points] == [sum(retractions.values())]
