"""Training steps on the real vLLM CPU engine: nesting, tail analytics, summary, PNG, CLI."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from otel_rollout import rollout_step
from otel_rollout.cli import main as cli_main
from testkit.engines import long_tail_lengths
from tests.conftest import OTelHarness
from tests.steps.expected import Request, expected

pytestmark = pytest.mark.vllm

STEP = "rollout.step"
BATCH = "rollout.batch"


def params_mix(vllm: Any, lengths: Sequence[int]) -> list[Any]:
    """Exact lengths: most run to max_tokens (``length``); every fifth stops on a token (``stop``).

    The ``stop`` requests must first produce ``min_tokens`` and then stop at the first token out
    of half the vocabulary, so they finish by themselves a few tokens later.
    """
    stop_ids = list(range(4, 1000, 2))
    out = []
    for i, n in enumerate(lengths):
        if i % 5 == 2:
            out.append(
                vllm.SamplingParams(max_tokens=n + 64, min_tokens=n, stop_token_ids=stop_ids)
            )
        else:
            out.append(vllm.SamplingParams(max_tokens=n, ignore_eos=True))
    return out


def prompts(n: int, tag: str) -> list[str]:
    return [f"{tag} request {i}: tell a story" for i in range(n)]


def span_tree(spans: Sequence[Any]) -> tuple[list[Any], dict[int, Any], list[Any]]:
    steps = [s for s in spans if s.name == STEP]
    batches = {s.context.span_id: s for s in spans if s.name == BATCH}
    requests = [s for s in spans if s.parent is not None and s.parent.span_id in batches]
    return steps, batches, requests


def as_request(span: Any) -> Request:
    reasons = span.attributes.get("gen_ai.response.finish_reasons") or ["?"]
    return Request(
        span.start_time,
        span.end_time,
        int(span.attributes["gen_ai.usage.output_tokens"]),
        reasons[0],
    )


def requests_of(step_span: Any, spans: Sequence[Any]) -> list[Any]:
    _, batches, requests = span_tree(spans)
    return [
        r for r in requests if batches[r.parent.span_id].parent.span_id == step_span.context.span_id
    ]


def test_long_tail_steps_match_independent_analytics(
    otel: OTelHarness, llm: Any, vllm_module: Any
) -> None:
    per_step = {}
    for step in (1, 2):
        lengths = long_tail_lengths(24, seed=step, high=192)
        with rollout_step(step):
            outs = llm.generate(prompts(len(lengths), f"s{step}"), params_mix(vllm_module, lengths))
        per_step[step] = (lengths, outs)

    spans = otel.finished_spans()
    steps, batches, requests = span_tree(spans)
    assert sorted(s.attributes[STEP] for s in steps) == [1, 2]
    expectations = {}
    for step_span in steps:
        step = step_span.attributes[STEP]
        lengths, outs = per_step[step]
        mine = requests_of(step_span, spans)
        # Every request of the step sits under one batch span, which sits under the step span.
        assert len(mine) == len(lengths)
        assert {r.context.trace_id for r in mine} == {step_span.context.trace_id}
        assert all(r.attributes[STEP] == step for r in mine)
        reqs = [as_request(r) for r in mine]
        # The long-tail mix really happened: exact lengths for the truncated ones, some stops.
        assert sorted(r.output_tokens for r in reqs if r.finish_reason == "length") == sorted(
            n for i, n in enumerate(lengths) if i % 5 != 2
        )
        assert {r.finish_reason for r in reqs} == {"length", "stop"}
        exp = expected(reqs, tail_quantile=0.9)
        expectations[step] = exp
        attrs = step_span.attributes
        assert attrs["rollout.step.requests"] == exp.requests
        assert attrs["rollout.step.tail.duration_s"] == pytest.approx(exp.tail_duration_s, abs=1e-9)
        assert attrs["rollout.step.tail.requests"] == exp.tail_requests
        assert attrs["rollout.step.straggler_ratio"] == pytest.approx(exp.straggler_ratio, rel=1e-9)
        assert attrs["rollout.step.latency.p50_s"] == pytest.approx(exp.latency_p50_s, abs=1e-9)
        assert attrs["rollout.step.latency.p90_s"] == pytest.approx(exp.latency_p90_s, abs=1e-9)
        assert attrs["rollout.step.latency.max_s"] == pytest.approx(exp.latency_max_s, abs=1e-9)
        assert attrs["rollout.step.idle_capacity_s"] == pytest.approx(exp.idle_capacity_s, abs=1e-9)
        assert attrs["rollout.step.idle_fraction"] == pytest.approx(exp.idle_fraction, rel=1e-9)
        assert attrs["rollout.step.peak_active"] == exp.peak_active
        assert attrs["rollout.step.output_tokens.max"] == exp.output_tokens_max
        assert attrs["rollout.step.output_tokens.p50"] == exp.output_tokens_p50
        assert attrs["rollout.step.output_tokens.p90"] == exp.output_tokens_p90
        assert attrs["rollout.step.truncation_ratio"] == pytest.approx(exp.truncation_ratio)
        assert exp.tail_duration_s > 0 and exp.straggler_ratio > 1  # a real tail, not a tie

    def one(name: str, **attrs: Any) -> Any:
        points = [
            p
            for p in otel.metric_points(name)
            if all(p.attributes.get(k) == v for k, v in attrs.items())
        ]
        assert len(points) == 1, (name, points)
        assert points[0].count == 2  # one point per step
        return points[0]

    both = list(expectations.values())
    for metric, field in (
        ("rollout.step.tail.duration", "tail_duration_s"),
        ("rollout.step.tail.requests", "tail_requests"),
        ("rollout.step.straggler_ratio", "straggler_ratio"),
        ("rollout.step.idle_capacity", "idle_capacity_s"),
        ("rollout.step.idle_fraction", "idle_fraction"),
        ("rollout.step.truncation_ratio", "truncation_ratio"),
        ("rollout.step.requests", "requests"),
    ):
        point = one(metric)
        assert point.sum == pytest.approx(sum(getattr(e, field) for e in both), rel=1e-9), metric
        assert point.attributes["gen_ai.provider.name"] == "vllm"
    for stat in ("max", "p50", "p90"):
        point = one("rollout.step.output_tokens", **{"rollout.statistic": stat})
        assert point.sum == sum(getattr(e, f"output_tokens_{stat}") for e in both)


def test_async_tasks_nest_under_the_step(otel: OTelHarness, llm: Any, vllm_module: Any) -> None:
    # The offline LLM is not thread-safe: the lock serialises engine use, while the tasks (and
    # the threads asyncio.to_thread runs them on) are genuinely concurrent.
    engine_lock = threading.Lock()

    def generate(tag: str, lengths: list[int]) -> Any:
        with engine_lock:
            return llm.generate(prompts(len(lengths), tag), params_mix(vllm_module, lengths))

    async def task(i: int) -> int:
        await asyncio.sleep(0.01 * i)
        outs = await asyncio.to_thread(
            generate, f"t{i}", long_tail_lengths(6, seed=10 + i, high=64)
        )
        return len(outs)

    async def rollout() -> int:
        async with rollout_step(3):
            counts = await asyncio.gather(*(task(i) for i in range(4)))
        return sum(counts)

    total = asyncio.run(rollout())
    spans = otel.finished_spans()
    steps, batches, requests = span_tree(spans)
    assert len(steps) == 1 and steps[0].attributes[STEP] == 3
    step_span = steps[0]
    assert len(batches) == 4
    assert all(b.parent.span_id == step_span.context.span_id for b in batches.values())
    assert len(requests) == total == 24
    assert {r.context.trace_id for r in requests} == {step_span.context.trace_id}
    assert all(r.attributes[STEP] == 3 for r in requests)
    assert step_span.attributes["rollout.step.requests"] == 24
    exp = expected([as_request(r) for r in requests])
    assert step_span.attributes["rollout.step.tail.duration_s"] == pytest.approx(
        exp.tail_duration_s, abs=1e-9
    )


def test_batch_as_step_makes_unwrapped_batches_steps(
    otel: OTelHarness,
    llm: Any,
    vllm_module: Any,
    instrumented: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The setting is read when the instrumentor builds its Telemetry, so instrument again with it.
    instrumented.uninstrument()
    monkeypatch.setenv("OTEL_ROLLOUT_BATCH_AS_STEP", "1")
    instrumented.instrument()
    try:
        for tag in ("a", "b"):
            lengths = long_tail_lengths(8, seed=ord(tag), high=64)
            llm.generate(prompts(len(lengths), tag), params_mix(vllm_module, lengths))
        with rollout_step(40):  # inside an explicit step, a batch is not a step of its own
            llm.generate(prompts(3, "c"), vllm_module.SamplingParams(max_tokens=4, ignore_eos=True))
    finally:
        instrumented.uninstrument()
        monkeypatch.delenv("OTEL_ROLLOUT_BATCH_AS_STEP")
        instrumented.instrument()

    spans = otel.finished_spans()
    steps, batches, requests = span_tree(spans)
    assert [s.attributes[STEP] for s in steps] == [1, 2, 40]
    for step_span, n in zip(steps, (8, 8, 3), strict=False):
        mine = requests_of(step_span, spans)
        assert len(mine) == n
        assert step_span.attributes["rollout.step.requests"] == n
        assert all(r.attributes[STEP] == step_span.attributes[STEP] for r in mine)
    assert len(batches) == 3


def nonblank_png(path: Path) -> None:
    from matplotlib import image

    pixels = image.imread(path)
    rgb = pixels[..., :3]
    assert rgb.shape[0] > 300 and rgb.shape[1] > 800
    non_white = (rgb.min(axis=-1) < 0.9).mean()
    assert rgb.std() > 0.05 and 0.02 < non_white < 0.9, (rgb.std(), non_white)


def test_summary_png_and_cli_report(
    otel: OTelHarness,
    llm: Any,
    vllm_module: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    reports, log = tmp_path / "live", tmp_path / "steps.jsonl"
    monkeypatch.setenv("OTEL_ROLLOUT_STEP_SUMMARY", "1")
    monkeypatch.setenv("OTEL_ROLLOUT_REPORT_DIR", str(reports))
    monkeypatch.setenv("OTEL_ROLLOUT_STEP_LOG", str(log))
    for step in (5, 6):
        lengths = long_tail_lengths(16, seed=step, high=160)
        with rollout_step(step):
            llm.generate(prompts(len(lengths), f"r{step}"), params_mix(vllm_module, lengths))

    err = capsys.readouterr().err
    steps = {s.attributes[STEP]: s for s in span_tree(otel.finished_spans())[0]}
    for step in (5, 6):
        assert f"[otel_rollout] step {step}: 16 requests" in err
        # The slowest request is listed with its trace id: the step's trace.
        assert f"trace_id={steps[step].context.trace_id:032x}" in err

    live = sorted(reports.glob("*.png"))
    assert [p.name for p in live] == ["step-000005.png", "step-000006.png"]
    for path in live:
        nonblank_png(path)

    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["step"] for e in entries] == [5, 6]
    for entry in entries:
        assert len(entry["requests"]) == 16
        assert entry["stats"]["requests"] == 16
        assert entry["trace_id"] == f"{steps[entry['step']].context.trace_id:032x}"
        assert min(r["arrival_ns"] for r in entry["requests"]) == 0
        assert all(r["finish_ns"] >= r["arrival_ns"] for r in entry["requests"])

    out = tmp_path / "rendered"
    assert cli_main(["report", str(log), "-o", str(out), "--step", "6"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / "step-000006.png")]
    nonblank_png(out / "step-000006.png")
    assert os.path.getsize(out / "step-000006.png") > 20_000
