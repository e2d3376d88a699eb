"""The engine's own figures per step through vLLM's stat-logger interface (#12 item 2).

The instrumentor hands our stat logger to every engine built with stats on (``AsyncLLM``, and the
offline ``LLMEngine`` from vLLM 0.12), to no other.
Over a step, the figures it summed must equal the deltas of vLLM's own Prometheus
counters (its ``PrometheusStatLogger`` sees the same iterations in this process), and the tokens
the step's requests really generated.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from otel_rollout import rollout_step
from otel_rollout.reports.summary import format_summary
from tests.conftest import OTelHarness

pytestmark = pytest.mark.vllm

COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)


def _counters() -> dict[str, float]:
    from prometheus_client import REGISTRY

    totals = dict.fromkeys(COUNTERS, 0.0)
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals


def _our_loggers(engine_core: Any) -> list[Any]:
    manager = engine_core.logger_manager
    return [
        logger
        for adapter in (manager.stat_loggers if manager is not None else ())
        for logger in getattr(adapter, "per_engine_stat_loggers", {}).values()
        if type(logger).__module__ == "otel_rollout.vllm.stat_logger"
    ]


def test_stats_on_engines_get_our_logger_and_stats_off_engines_stay_off(
    engine: Any, llm: Any, llm_stats: Any
) -> None:
    """Observing never turns an engine's stats on (vLLM would, for any stat logger given)."""
    assert len(_our_loggers(engine)) == 1  # AsyncLLM, stats on by default
    # LLM(disable_log_stats=False): from vLLM 0.12 (0.11's LLMEngine raises for any stat logger:
    # tests/compat covers it)
    assert len(_our_loggers(llm_stats.llm_engine)) == 1
    assert llm.llm_engine.log_stats is False  # LLM(): vLLM's default, untouched
    assert llm.llm_engine.logger_manager is None


def test_step_figures_equal_the_engines_own_counters(
    otel: OTelHarness, engine: Any, loop: asyncio.AbstractEventLoop, vllm_module: Any
) -> None:
    lengths = [8, 16, 24, 32, 48, 64, 96, 128]
    shared = "the same long instruction for every sample of the group " * 8

    async def one(i: int) -> int:
        params = vllm_module.SamplingParams(max_tokens=lengths[i], ignore_eos=True)
        last = None
        async for out in engine.generate(f"{shared} {i}", params, f"stats-{i}"):
            last = out
        assert last is not None
        return len(last.outputs[0].token_ids)

    async def scenario() -> tuple[Any, list[int]]:
        with rollout_step(71) as step:
            produced = await asyncio.gather(*(one(i) for i in range(len(lengths))))
        return step, list(produced)

    before = _counters()
    step, produced = loop.run_until_complete(scenario())
    delta = {k: v - before[k] for k, v in _counters().items()}
    assert produced == lengths
    e = step.stats.engine
    assert e is not None, "no iteration reached the plugin"
    assert e.generation_tokens == sum(lengths) == delta["vllm:generation_tokens_total"]
    assert e.prompt_tokens == delta["vllm:prompt_tokens_total"] > 0
    assert e.preemptions == delta["vllm:num_preemptions_total"]
    queries, hits = delta["vllm:prefix_cache_queries_total"], delta["vllm:prefix_cache_hits_total"]
    assert e.prefix_cache_hit_rate == (pytest.approx(hits / queries) if queries else None)
    assert e.iterations >= max(lengths)  # one generated token per request per iteration
    assert 1 <= e.running_peak <= len(lengths)
    assert 0 < e.kv_cache_usage_mean <= e.kv_cache_usage_peak <= 1
    assert e.aborted == 0
    (span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert span.attributes["rollout.step.engine.generation_tokens"] == sum(lengths)
    assert span.attributes["rollout.step.engine.kv_cache_usage.peak"] == e.kv_cache_usage_peak
    points = otel.metric_points("rollout.step.engine.kv_cache_usage")
    assert sorted(p.attributes["rollout.statistic"] for p in points) == ["mean", "peak"]
    text = format_summary(71, step.stats)
    assert f"| {sum(lengths)} tokens generated (" in text
    print("\n" + text)


def test_offline_step_figures_equal_the_engines_own_counters(
    otel: OTelHarness, llm_stats: Any, vllm_module: Any
) -> None:
    """``LLM(disable_log_stats=False)``: the offline engine's iterations reach the step too.

    Compared with the requests' own outputs: the offline engine's Prometheus counters are no
    longer in the registry once a later engine of the process (the session's ``AsyncLLM``)
    registered its own."""
    lengths = [8, 24, 64, 96]
    params = [vllm_module.SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    with rollout_step(72) as step:
        outputs = llm_stats.generate(
            [f"offline stats {i}" for i in range(len(lengths))], params, use_tqdm=False
        )
    assert [len(o.outputs[0].token_ids) for o in outputs] == lengths
    e = step.stats.engine
    assert e is not None, "no offline iteration reached the logger"
    assert e.generation_tokens == sum(lengths)
    assert e.prompt_tokens == sum(len(o.prompt_token_ids) for o in outputs)
    assert e.preemptions == step.stats.preemptions == 0
    assert e.iterations >= max(lengths)
    assert 0 < e.kv_cache_usage_mean <= e.kv_cache_usage_peak <= 1
    (span,) = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    assert span.attributes["rollout.step.engine.generation_tokens"] == sum(lengths)


def _passthrough(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return wrapped(*args, **kwargs)


def _init(vllm_config: Any, executor_class: Any, log_stats: bool, stat_loggers: Any = None) -> Any:
    return stat_loggers


def _old_init(vllm_config: Any, executor_class: Any, log_stats: bool) -> Any:
    return "no stat_loggers parameter"


def test_the_logger_is_added_only_when_stats_are_on(vllm_module: Any) -> None:
    """The constructor wrapper with vLLM's signatures (stand-in constructors: what is tested is
    the argument we pass, not an engine)."""
    from otel_rollout.vllm import adapter
    from otel_rollout.vllm.stat_logger import RolloutStatLogger
    from testkit.engines import vllm_telemetry

    wrapper = adapter.engine_init_wrapper(vllm_telemetry(), _passthrough)
    assert wrapper(_init, None, ("cfg", "ex"), {"log_stats": True}) == [RolloutStatLogger]
    assert wrapper(_init, None, ("cfg", "ex", True), {}) == [RolloutStatLogger]
    assert wrapper(_init, None, ("cfg", "ex"), {"log_stats": False}) is None
    given = object()
    kwargs = {"log_stats": True, "stat_loggers": [given]}
    assert wrapper(_init, None, ("cfg", "ex"), kwargs) == [given, RolloutStatLogger]
    assert wrapper(_old_init, None, ("cfg", "ex", True), {}) == "no stat_loggers parameter"
    offline = adapter.engine_init_wrapper(vllm_telemetry(), _passthrough, offline=True)
    expected = [RolloutStatLogger] if adapter.offline_takes_stat_loggers() else None
    assert offline(_init, None, ("cfg", "ex"), {"log_stats": True}) == expected
    assert offline(_init, None, ("cfg", "ex"), {"log_stats": False}) is None
