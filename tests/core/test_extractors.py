"""Engine objects → ``RequestRecord``, engine-free: vLLM's and SGLang's translation.

The real-engine suites check the same translation against the engines themselves; these pin
down every timing source and shape (stats on, engine-step times, observed; ``n > 1``; no prompt
ids; SGLang's ``meta_info`` with and without ``enable_metrics``, streamed or not, failed) in
milliseconds, on objects shaped as vLLM 0.32's ``RequestOutput`` / ``RequestStateStats`` /
``CompletionOutput`` and SGLang 0.5.23's ``meta_info`` (stand-ins built here, named as such: the
core environment has neither engine).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from otel_rollout.record import Clock
from otel_rollout.sglang.adapter import timeline
from otel_rollout.sglang.adapter import weight_versions as sglang_weight_versions
from otel_rollout.telemetry import Telemetry
from otel_rollout.vllm.adapter import (
    ASYNC_TIMES,
    StepTimes,
    add_request_wrapper,
    process_outputs_wrapper,
    record_from_output,
)

WALL0 = 1_700_000_000.0  # the request's arrival, wall clock (s)
MONO0 = 5_000.0  # the same moment on the monotonic clock the engine stamps with (s)


def choice(tokens: int, reason: str | None = "length", text: str = "t") -> Any:
    return SimpleNamespace(token_ids=list(range(tokens)), finish_reason=reason, text=text)


def output(rid: str = "r1", choices: list[Any] | None = None, stats: Any = None) -> Any:
    return SimpleNamespace(
        request_id=rid,
        outputs=choices if choices is not None else [choice(8)],
        prompt_token_ids=[1, 2, 3],
        num_cached_tokens=2,
        metrics=stats,
        prompt="hello",
    )


def engine_stats(generated: int = 8) -> Any:
    """``RequestStateStats``: arrival on the wall clock, the rest on the monotonic clock."""
    return SimpleNamespace(
        arrival_time=WALL0,
        queued_ts=MONO0 + 0.01,
        scheduled_ts=MONO0 + 0.25,
        first_token_ts=MONO0 + 0.75,
        last_token_ts=MONO0 + 2.75,
        num_generation_tokens=generated,
        num_preemptions=2,
    )


class FixedClock(Clock):
    """A clock whose monotonic MONO0 is wall WALL0, so expected times are exact."""

    def __init__(self) -> None:
        self._offset_ns = int(WALL0 * 1e9) - int(MONO0 * 1e9)


def translate(out: Any, times: StepTimes | None = None, **kw: Any) -> Any:
    fallback = int((WALL0 + 100) * 1e9)
    return record_from_output(
        out, "text_completion", "m", FixedClock(), fallback, fallback + 10**9, times, False, **kw
    )


def test_engine_stats_give_the_engines_own_timeline() -> None:
    rec = translate(output(stats=engine_stats()))
    assert rec.timing_source == "engine"
    assert rec.preemptions == 2  # vLLM's own count, as it reported it
    assert rec.arrival_ns == int(WALL0 * 1e9)
    assert rec.queue_time_s == pytest.approx(0.25, abs=1e-6)
    assert rec.ttft_s == pytest.approx(0.75, abs=1e-6)
    assert rec.duration_s == pytest.approx(2.75, abs=1e-6)
    assert (rec.prompt_tokens, rec.output_tokens, rec.cached_tokens) == (3, 8, 2)
    assert rec.finish_reasons == ("length",)


def test_engine_step_times_when_stats_are_off() -> None:
    times = StepTimes()
    times.arrival["r1"] = WALL0
    times.first["r1"] = MONO0 + 0.5
    times.finish["r1"] = MONO0 + 1.5
    rec = translate(output(), times)
    assert rec.timing_source == "engine_steps"
    assert rec.ttft_s == pytest.approx(0.5, abs=1e-6)
    assert rec.duration_s == pytest.approx(1.5, abs=1e-6)
    assert rec.queue_time_s is None  # vLLM records no scheduling event with stats off
    assert rec.output_tokens == 8


def test_observed_when_the_engine_reported_nothing() -> None:
    times = StepTimes()
    times.arrival["r1"] = WALL0  # arrival seen, finish never: not the engine's timeline
    rec = translate(output(), times)
    assert rec.timing_source == "observed"
    assert rec.duration_s == pytest.approx(1.0)
    assert rec.first_token_ns is None


def _core_output(engine_id: str, tokens: int, finished: bool) -> Any:
    """An ``EngineCoreOutput`` as vLLM's output handler passes it to ``process_outputs``."""
    return SimpleNamespace(
        request_id=engine_id, new_token_ids=[7] * tokens, finish_reason=1 if finished else None
    )


def test_async_requests_are_timed_by_engine_steps_and_leave_nothing(
    make_telemetry: Callable[..., Telemetry],
) -> None:
    """``AsyncLLM`` with stats off: a watched request (n = 2: two engine ids, vLLM 0.32's
    ``external_req_id``) gets the stamps of the step of its first token and of its last finish;
    an unwatched one is not tracked; forgetting it leaves nothing behind."""
    telemetry = make_telemetry()
    add, process = add_request_wrapper(telemetry), process_outputs_wrapper(telemetry)

    def engine(*args: Any, **kwargs: Any) -> str:
        return "the engine's own result"

    ASYNC_TIMES.watch("r1")
    for engine_id in ("0_r1-a1", "1_r1-a1", "other-b2"):
        external = engine_id.split("_")[-1].split("-")[0]
        request = SimpleNamespace(
            request_id=engine_id, external_req_id=external, arrival_time=WALL0
        )
        assert add(engine, None, (request, None, None, 0, None), {}) == "the engine's own result"
    steps = [
        ([_core_output("0_r1-a1", 1, False), _core_output("other-b2", 1, False)], MONO0 + 0.1),
        ([_core_output("0_r1-a1", 1, True), _core_output("1_r1-a1", 1, False)], MONO0 + 0.5),
        ([_core_output("1_r1-a1", 1, True), _core_output("other-b2", 1, True)], MONO0 + 0.9),
    ]
    for outputs, stamp in steps:
        assert process(engine, None, (outputs, stamp, None), {}) == "the engine's own result"
    assert "other" not in ASYNC_TIMES.arrival
    rec = translate(output("r1", [choice(2), choice(2)]), ASYNC_TIMES)
    assert rec.timing_source == "engine_steps"
    assert rec.arrival_ns == int(WALL0 * 1e9)
    assert rec.ttft_s == pytest.approx(0.1, abs=1e-6)
    assert rec.duration_s == pytest.approx(0.9, abs=1e-6)
    assert ASYNC_TIMES.forget("r1") == (WALL0, MONO0 + 0.1, MONO0 + 0.9)
    assert not any(
        (ASYNC_TIMES.watched, ASYNC_TIMES.external, ASYNC_TIMES.engine_ids, ASYNC_TIMES.arrival)
    )
    assert not (ASYNC_TIMES.first or ASYNC_TIMES.finish)


def test_a_request_id_watched_twice_is_kept_until_both_end() -> None:
    ASYNC_TIMES.watch("dup")
    ASYNC_TIMES.watch("dup")
    ASYNC_TIMES.arrival["dup"] = WALL0
    assert ASYNC_TIMES.forget("dup") == (WALL0, None, None)
    assert ASYNC_TIMES.watched == {"dup": 1}
    ASYNC_TIMES.forget("dup")
    assert not (ASYNC_TIMES.watched or ASYNC_TIMES.arrival)


def test_n_greater_than_one_counts_every_sample() -> None:
    """With ``n > 1`` vLLM's stats are the last sample's: the record counts all samples."""
    out = output(choices=[choice(4, "stop"), choice(9, "length")], stats=engine_stats(9))
    rec = translate(out)
    assert rec.output_tokens == 13
    assert rec.finish_reasons == ("stop", "length")


def test_unknown_and_missing_finish_reasons_stay_bounded() -> None:
    rec = translate(output(choices=[choice(2, "weird_reason"), choice(1, None)]))
    assert rec.finish_reasons == ("other",)


def test_an_explicit_token_count_wins() -> None:
    """Streams pass the tokens they counted (merged chunks): the stats are not asked again."""
    assert translate(output(stats=engine_stats(8)), output_tokens=5).output_tokens == 5


def test_no_prompt_ids_means_no_prompt_count() -> None:
    out = output()
    out.prompt_token_ids = None
    assert translate(out).prompt_tokens is None


# --- SGLang: meta_info → timeline ---------------------------------------------------------------

NS = 10**9
CALL, SEEN, FIRST, NOW = 100 * NS, 103 * NS, 101 * NS, 104 * NS  # what the stream observed


def test_sglang_enable_metrics_is_the_engines_own_timeline() -> None:
    meta = {
        "request_received_ts": 50.0,
        "e2e_latency": 2.5,
        "first_token_latency": 0.5,
        "forward_entry_time": 50.25,
    }
    assert timeline(meta, False, CALL, SEEN, None, NOW, None) == (
        50 * NS,
        52_500_000_000,
        50_500_000_000,
        50_250_000_000,
        "engine",
    )


def test_sglang_default_places_e2e_latency_at_the_response_it_was_sent_with() -> None:
    meta = {"e2e_latency": 2.0, "response_sent_to_client_ts": 60.0}
    arrival, finish, first, scheduled, source = timeline(meta, False, CALL, SEEN, None, NOW, None)
    assert (arrival, finish, first, scheduled, source) == (
        58 * NS,
        60 * NS,
        None,
        None,
        "engine_latency",
    )


def test_sglang_default_streamed_ends_when_the_last_chunk_was_seen() -> None:
    """A stream's ``response_sent_to_client_ts`` is its first chunk's: the finish is when the
    final chunk was seen; the first token is the first chunk's stamp."""
    meta = {"e2e_latency": 2.0, "response_sent_to_client_ts": 60.0}
    assert timeline(meta, True, CALL, SEEN, FIRST, NOW, None) == (
        SEEN - 2 * NS,
        SEEN,
        FIRST,
        None,
        "engine_latency",
    )


def test_sglang_0_4_with_metrics_keeps_its_e2e_latency_labelled() -> None:
    """0.4.x's ``meta_info`` with ``enable_metrics`` (its released source: ``e2e_latency``, no
    ``request_received_ts``, no first-token or forward stamps): the engine's latency ends where
    the final chunk was seen, the first token is the stream's, no queue time; labelled
    ``engine_latency``, not ``engine``."""
    meta = {"id": "r", "e2e_latency": 2.0, "finish_reason": {"type": "length"}}
    assert timeline(meta, True, CALL, SEEN, FIRST, NOW, None) == (
        SEEN - 2 * NS,
        SEEN,
        FIRST,
        None,
        "engine_latency",
    )
    non_streamed = timeline(meta, False, CALL, SEEN, None, NOW, None)
    assert non_streamed == (SEEN - 2 * NS, SEEN, None, None, "engine_latency")


@pytest.mark.parametrize(
    "meta, error",
    [
        ({}, None),  # no latency reported: nothing of the engine's to use
        ({"e2e_latency": 2.0, "request_received_ts": 50.0}, RuntimeError("engine failed")),
    ],
)
def test_sglang_observed_when_failed_or_unreported(meta: dict[str, Any], error: Any) -> None:
    assert timeline(meta, True, CALL, SEEN, FIRST, NOW, error) == (
        CALL,
        NOW,
        FIRST,
        None,
        "observed",
    )


def test_an_aborted_request_says_so() -> None:
    """vLLM's ``abort`` (the caller cancelled, or the engine evicted the request for good)."""
    rec = translate(output(choices=[choice(3, "abort")], stats=engine_stats(3)))
    assert rec.finish_reasons == ("abort",)
    assert rec.output_tokens == 3
    assert rec.timing_source == "engine"


def test_a_stream_that_failed_mid_request_ends_when_it_failed(
    make_telemetry: Callable[..., Telemetry], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``AsyncLLM`` stream that raised after its first chunks: the record carries the error,
    and its end is when the failure was seen, not the engine's last token of an unfinished
    request (which would make a failed request look short)."""
    from opentelemetry import context

    from otel_rollout.vllm.adapter import AsyncRequest

    telemetry = make_telemetry()
    emitted: list[Any] = []
    monkeypatch.setattr(telemetry, "emit", lambda record, parent: emitted.append(record))
    request = AsyncRequest(telemetry, "m", "r9", None, context.get_current())
    telemetry.requests_started("m", "text_completion")
    chunk = output("r9", [choice(2, None)], stats=engine_stats(2))
    chunk.finished = False
    assert request.item(chunk) is False  # the engine counts: no more chunks need be seen
    error = RuntimeError("engine died (fault injected here)")
    before = time.time_ns()
    request.finish(error, chunk)
    (record,) = emitted
    assert record.error is error
    assert record.timing_source == "engine"
    # the engine's last token was stamped in 2023 (WALL0): the end is when the failure was seen
    assert record.finish_ns >= before - 5_000_000
    assert record.output_tokens == 2


def test_sglang_0_5_5_first_token_and_forward_entry_from_its_own_names() -> None:
    """0.5.5 (enable_metrics): ``prefill_finished_ts`` is the first token's wall stamp, the
    forward entry is ``decode_finished_ts − forward_time`` (docs/ENGINE_NOTES.md)."""
    meta = {
        "request_received_ts": 50.0,
        "e2e_latency": 2.5,
        "prefill_finished_ts": 50.5,
        "decode_finished_ts": 52.5,
        "forward_time": 2.25,
    }
    assert timeline(meta, False, CALL, SEEN, None, NOW, None) == (
        50 * NS,
        52_500_000_000,
        50_500_000_000,
        50_250_000_000,
        "engine",
    )


def test_sglang_0_5_6_to_0_5_8_first_token_from_decode_throughput() -> None:
    """0.5.6-0.5.8: ``decode_throughput`` = completion tokens / (finish − first token), and
    ``inference_time`` = finish − forward entry."""
    meta = {
        "request_received_ts": 50.0,
        "e2e_latency": 2.5,
        "completion_tokens": 40,
        "decode_throughput": 20.0,  # 40 tokens in the 2 s after the first token
        "decode_finished_ts": 52.5,
        "inference_time": 2.25,
    }
    assert timeline(meta, False, CALL, SEEN, None, NOW, None) == (
        50 * NS,
        52_500_000_000,
        50_500_000_000,
        50_250_000_000,
        "engine",
    )


def test_sglang_without_any_first_token_source_leaves_it_unset() -> None:
    meta = {"request_received_ts": 50.0, "e2e_latency": 2.5, "decode_throughput": 0.0}
    assert timeline(meta, False, CALL, SEEN, None, NOW, None)[2:4] == (None, None)


def test_without_engine_stats_preemptions_are_not_reported() -> None:
    assert translate(output(stats=None)).preemptions is None


# --- the engine's own weight versions (#40 item 1) ---------------------------------------------


def _span(version: str, start: int, end: int) -> Any:
    """vLLM 0.32's ``WeightVersionSpan`` (stand-in)."""
    return SimpleNamespace(version=version, start=start, end=end)


def test_vllm_weight_versions_are_the_engines_own_over_every_sample() -> None:
    first = choice(8)
    first.weight_versions = [_span("v1", 0, 5), _span("v2", 5, 8)]
    second = choice(6)
    second.weight_versions = [_span("v1", 0, 2), _span("v2", 2, 6)]
    record = translate(output(choices=[first, second], stats=engine_stats()))
    assert record.weight_versions == (("v1", 7), ("v2", 7))  # summed over the samples
    assert (record.weight_version, record.weight_version_source) == ("v1", "engine")


@pytest.mark.parametrize(
    "spans",
    [None, [], [_span("default", 0, 8)]],
    ids=["older-release", "nothing-generated", "never-named"],
)
def test_vllm_without_a_named_engine_version_leaves_it_to_the_count(spans: Any) -> None:
    c = choice(8)
    c.weight_versions = spans
    record = translate(output(choices=[c], stats=engine_stats()))
    assert record.weight_versions == () and record.weight_version_source is None
    assert record.weight_version is None  # stamped at hand-over, from our own record


def test_a_numeric_engine_label_is_a_number_like_a_named_one() -> None:
    c = choice(4)
    c.weight_versions = [_span("default", 0, 1), _span("12", 1, 4)]
    record = translate(output(choices=[c], stats=engine_stats()))
    assert record.weight_versions == (("default", 1), ("12", 3))
    assert record.weight_version == "default"  # its first token: the initial weights
    c.weight_versions = [_span("12", 0, 4)]
    assert translate(output(choices=[c], stats=engine_stats())).weight_version == 12


def test_sglang_weight_versions_from_meta_info() -> None:
    meta = {
        "weight_versions": [
            {"version": "a", "start": 0, "end": 3},
            {"version": "b", "start": 3, "end": 10},
        ],
        "weight_version": "b",
    }
    assert sglang_weight_versions(meta) == (("a", 3), ("b", 7))
    assert sglang_weight_versions({"weight_version": "default"}) == ()  # 0.5.8: no spans
    default_only = {"weight_versions": [{"version": "default", "start": 0, "end": 4}]}
    assert sglang_weight_versions(default_only) == ()
    assert sglang_weight_versions({"weight_versions": [{"version": "x"}]}) == ()  # malformed


def test_sglang_health_probes_are_not_requests() -> None:
    """SGLang's ``/health`` generates one token as ``HEALTH_CHECK_<hex>`` (its constant's prefix);
    tests/slime counts, through the real router that polls it, that none becomes a request."""
    from types import SimpleNamespace

    from otel_rollout.sglang.adapter import is_health_check

    assert is_health_check(SimpleNamespace(rid="HEALTH_CHECK_9c3ecdcae2c24fc9"))
    assert not is_health_check(SimpleNamespace(rid="gnt-Lr3MmzxC69izWIVZGT7C3aJT"))
    assert not is_health_check(SimpleNamespace(rid=["HEALTH_CHECK_1", "x"]))  # a batch: a user's
    assert not is_health_check(SimpleNamespace(rid=None))
