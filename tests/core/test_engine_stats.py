"""The engine's per-iteration figures summed per step (engine_stats) and vLLM's stat objects
translated (stat_logger.sample), without an engine: the stat objects are plain stand-ins with
vLLM 0.32's field names (the real ones are read in tests/vllm/test_stat_logger.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from otel_rollout import engine_stats
from otel_rollout.analysis import analyze_engine
from otel_rollout.engine_stats import EngineSample, EngineWindow
from otel_rollout.vllm.stat_logger import sample


def _sample(**kw: object) -> EngineSample:
    base: dict[str, object] = dict(
        running=2,
        waiting=0,
        kv_cache_usage=0.5,
        prompt_tokens=0,
        generation_tokens=2,
        preemptions=0,
        prefix_queries=0,
        prefix_hits=0,
    )
    base.update(kw)
    return EngineSample(**base)  # type: ignore[arg-type]


def test_a_window_sums_and_peaks_its_iterations() -> None:
    w = EngineWindow()
    w.add(
        _sample(
            running=4,
            waiting=3,
            kv_cache_usage=0.2,
            prompt_tokens=100,
            prefix_queries=100,
            prefix_hits=60,
        )
    )
    w.add(_sample(kv_cache_usage=0.9, preemptions=1, finished=("abort", "stop")))
    w.add(_sample(kv_cache_usage=0.4, finished=("stop",)))
    assert (w.iterations, w.running_peak, w.waiting_peak) == (3, 4, 3)
    assert w.kv_cache_usage_peak == 0.9 and w.kv_cache_usage_mean == pytest.approx(0.5)
    assert (w.prompt_tokens, w.generation_tokens, w.preemptions) == (100, 6, 1)
    assert w.prefix_cache_hit_rate == pytest.approx(0.6)
    assert w.finished == {"abort": 1, "stop": 2}
    stats = analyze_engine([w, w], duration_s=2.0)  # two engines alike: Σ and max
    assert stats is not None
    assert (stats.iterations, stats.generation_tokens, stats.aborted) == (6, 12, 2)
    assert stats.generation_throughput == pytest.approx(6.0)
    assert stats.kv_cache_usage_peak == 0.9 and stats.kv_cache_usage_mean == pytest.approx(0.5)
    assert analyze_engine([], 1.0) is None and analyze_engine([EngineWindow()], 1.0) is None


def test_iterations_count_for_each_step_open_then_only() -> None:
    engine_stats.record("m", _sample())  # no step open: dropped
    engine_stats.open_window(1)
    engine_stats.record("m", _sample())
    engine_stats.open_window(2)  # overlapping steps (async RL): both see what runs in both
    engine_stats.record("m", _sample(generation_tokens=5))
    engine_stats.record("other", _sample(generation_tokens=7))
    first = engine_stats.close(1)
    engine_stats.record("m", _sample(generation_tokens=11))
    second = engine_stats.close(2)
    assert not engine_stats.has_open_steps()
    assert first["m"].generation_tokens == 7 and first["other"].generation_tokens == 7
    assert second["m"].generation_tokens == 16 and set(second) == {"m", "other"}


def test_vllm_stat_objects_to_a_sample() -> None:
    scheduler = SimpleNamespace(
        num_running_reqs=3,
        num_waiting_reqs=5,
        kv_cache_usage=0.25,
        prefix_cache_stats=SimpleNamespace(queries=256, hits=128),
    )
    finished = [
        SimpleNamespace(finish_reason=SimpleNamespace(name="LENGTH")),
        SimpleNamespace(finish_reason=SimpleNamespace(name="ABORT")),
    ]
    iteration = SimpleNamespace(
        num_prompt_tokens=40,
        num_generation_tokens=3,
        num_preempted_reqs=1,
        finished_requests=finished,
    )
    assert sample(scheduler, iteration) == EngineSample(
        3, 5, 0.25, 40, 3, 1, 256, 128, ("length", "abort")
    )
    # an iteration without outputs has no IterationStats; an older vLLM may lack a field
    assert sample(SimpleNamespace(kv_cache_usage=0.5), None) == EngineSample(
        0, 0, 0.5, 0, 0, 0, 0, 0
    )


class _Counter:
    """A poller over a counter the test advances (what an engine in another process would)."""

    def __init__(self) -> None:
        self.total, self.last, self.alive = 0, 0, True

    def __call__(self) -> bool:
        if self.alive:
            engine_stats.record("polled", _sample(generation_tokens=self.total - self.last))
            self.last = self.total
        return self.alive


def test_a_poller_is_read_when_a_step_opens_and_ends() -> None:
    """What the engine did before the step opened is not the step's; all it did until the step
    ended is, without waiting for the once-a-second read."""
    counter = _Counter()
    counter.total = 100  # before the poller existed: its first read is the baseline
    engine_stats.add_poller("counter", counter)
    try:
        counter.total = 130  # before the step
        engine_stats.open_window(3)
        counter.total = 175  # during it
        windows = engine_stats.close(3)
        assert windows["polled"].generation_tokens == 45
        counter.alive = False  # the engine shut down: the next read drops it
        engine_stats.poll()
        assert "counter" not in engine_stats._POLLERS
    finally:
        engine_stats._POLLERS.pop("counter", None)


def test_sglang_metrics_to_samples() -> None:
    """SGLang's Prometheus samples (names and labels as 0.5.23 writes them): one engine's,
    counters as deltas, the first TP rank's gauges, KV usage the max over DP schedulers."""
    from otel_rollout.sglang.scheduler_metrics import sample as sglang_sample
    from otel_rollout.sglang.scheduler_metrics import totals

    m = {"model_name": "tiny"}
    rank0, rank1 = {**m, "tp_rank": "0", "dp_rank": "0"}, {**m, "tp_rank": "1", "dp_rank": "0"}
    dp1 = {**m, "tp_rank": "0", "dp_rank": "1"}

    def read(generated: float, retracted: float) -> list[tuple[str, dict[str, str], float]]:
        return [
            ("sglang:generation_tokens_total", {**m, "is_streaming": "false"}, generated),
            ("sglang:generation_tokens_total", {**m, "is_streaming": "true"}, 10.0),
            ("sglang:generation_tokens_total", {"model_name": "other"}, 999.0),
            ("sglang:prompt_tokens_total", m, 50.0),
            ("sglang:num_retracted_requests_total", rank0, retracted),
            ("sglang:num_running_reqs", rank0, 3.0),
            ("sglang:num_running_reqs", rank1, 3.0),  # the same scheduler seen from rank 1
            ("sglang:num_running_reqs", dp1, 2.0),
            ("sglang:num_queue_reqs", rank0, 4.0),
            ("sglang:token_usage", rank0, 0.5),
            ("sglang:token_usage", dp1, 0.75),
            ("sglang:cache_hit_rate", rank0, 0.9),  # not read
        ]

    before, now = totals(read(100.0, 1.0), "tiny"), totals(read(160.0, 3.0), "tiny")
    assert now == {
        "generation_tokens": 170.0,
        "prompt_tokens": 50.0,
        "preemptions": 3.0,
        "running": 5.0,
        "waiting": 4.0,
        "kv_cache_usage": 0.75,
    }
    s = sglang_sample(before, now)
    assert (s.generation_tokens, s.prompt_tokens, s.preemptions) == (60, 0, 2)
    assert (s.running, s.waiting, s.kv_cache_usage, s.sampled) == (5, 4, 0.75, True)
    w = EngineWindow()
    w.add(s)
    stats = analyze_engine([w], 1.0)
    assert stats is not None and stats.source == "sampled"
    assert sglang_sample({"aborted": 1.0}, {"aborted": 3.0}).finished == ("abort", "abort")


def test_the_png_title_says_what_happened_inside_the_engine() -> None:
    """The step PNG's title line of preemptions, prefix-cache hits and KV pressure, read from the
    step log's stats (``asdict`` of the analysis), and nothing for a step without them."""
    from dataclasses import asdict

    from otel_rollout.analysis import analyze
    from otel_rollout.reports.png import _inside_engine
    from testkit.records import make_record

    records = [
        make_record("m", request_id=f"r{i}", prompt_tokens=100, cached_tokens=c, preemptions=p)
        for i, (c, p) in enumerate(((80, 0), (40, 2)))
    ]
    window = EngineWindow()
    window.add(_sample(kv_cache_usage=0.9, waiting=6))
    window.add(_sample(kv_cache_usage=0.5))
    stats = analyze(records, 3.0, engine_windows=[window])
    assert stats is not None
    assert _inside_engine(asdict(stats)) == (
        "preemptions 2 · prefix cache 60% of 200 prompt tokens · KV cache peak 90% mean 70% · "
        "waiting peak 6"
    )
    bare = analyze([make_record("m", cached_tokens=None)], 3.0)
    assert bare is not None and _inside_engine(asdict(bare)) == ""
