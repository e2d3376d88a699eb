"""Shared helpers for the benchmarks: SDK setup, real-shaped vLLM outputs, fake engines, stats.

Every benchmark script is a plain file run with the vLLM environment's interpreter; it writes one
JSON object (``--out``) that ``run.py`` collects. Nothing here measures anything by itself.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(1, str(REPO))  # testkit.engines (engine settings, long_tail_lengths)


# --- the OTel SDK, configured identically for "ours" and the floor ------------------------------


class NullSpanExporter:
    """A span exporter that accepts and drops everything (the SDK's cost without I/O)."""

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


_SDK: tuple[Any, Any, Any] | None = None


def setup_sdk(processor: str = "simple", views: Any = ()) -> tuple[Any, Any, Any]:
    """Install global providers once: real SDK, null span exporter, in-memory metric reader.

    ``simple`` (SimpleSpanProcessor) keeps every span's full SDK cost on the calling thread and
    never drops a span; ``batch`` is the production shape (BatchSpanProcessor, background thread).
    ``views`` go to the MeterProvider (e.g. ``otel_rollout.histograms.views(config)``).
    """
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    global _SDK
    if _SDK is not None:  # one global provider per process (run.py --smoke runs all in one)
        return _SDK
    resource = Resource.create({"service.name": "otel-rollout-bench"})
    tp = TracerProvider(resource=resource)
    exporter = NullSpanExporter()
    if processor == "batch":
        tp.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
    else:
        tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader], resource=resource, views=views)
    trace.set_tracer_provider(tp)
    metrics.set_meter_provider(mp)
    # Re-instrumenting re-creates instruments with the same names; the SDK warns each time.
    logging.getLogger("opentelemetry.sdk.metrics._internal").setLevel(logging.ERROR)
    _SDK = (tp, mp, reader)
    return _SDK


# --- real-shaped vLLM outputs ------------------------------------------------------------------


def long_tail(n: int, seed: int = 0, high: int = 256) -> list[int]:
    from testkit.engines import long_tail_lengths

    return long_tail_lengths(n, seed=seed, high=high)


def make_stats(arrival: float, mono0: float, tokens: int) -> Any:
    from vllm.v1.metrics.stats import RequestStateStats

    s = RequestStateStats()
    s.arrival_time = arrival
    s.queued_ts = mono0
    s.scheduled_ts = mono0 + 0.002
    s.first_token_ts = mono0 + 0.010
    s.last_token_ts = mono0 + 0.010 + 0.004 * max(0, tokens - 1)
    s.first_token_latency = 0.010
    s.num_generation_tokens = tokens
    return s


def make_output(
    rid: str,
    tokens: int,
    *,
    stats: bool,
    finished: bool = True,
    prompt_len: int = 12,
    metrics: Any = None,
) -> Any:
    """A vllm.outputs.RequestOutput exactly as LLM.generate / AsyncLLM return it."""
    from vllm.outputs import CompletionOutput, RequestOutput

    if stats and metrics is None:
        metrics = make_stats(time.time() - 1.0, time.monotonic() - 1.0, tokens)
    choice = CompletionOutput(
        index=0,
        text="x" * tokens,
        token_ids=list(range(tokens)),
        cumulative_logprob=None,
        logprobs=None,
        finish_reason="length" if finished else None,
    )
    return RequestOutput(
        request_id=rid,
        prompt=f"prompt {rid}",
        prompt_token_ids=list(range(prompt_len)),
        prompt_logprobs=None,
        outputs=[choice],
        finished=finished,
        metrics=metrics,
        num_cached_tokens=0,
    )


def make_outputs(lengths: Sequence[int], *, stats: bool) -> list[Any]:
    return [make_output(str(i), n, stats=stats) for i, n in enumerate(lengths)]


def make_params(lengths: Sequence[int]) -> list[Any]:
    from vllm import SamplingParams

    return [
        SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.7, seed=i)
        for i, n in enumerate(lengths)
    ]


class _ModelConfig:
    served_model_name = "tiny-llama-v1"
    model = "/models/tiny-llama-v1"


class _Engine:
    def __init__(self, log_stats: bool) -> None:
        self.log_stats = log_stats
        self.model_config = _ModelConfig()


# --- system facts for the results table ----------------------------------------------------------


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        from importlib.metadata import version

        info["opentelemetry_sdk"] = version("opentelemetry-sdk")
        import vllm

        info["vllm"] = vllm.__version__
    except Exception:
        pass
    try:
        info["commit"] = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        pass
    return info


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def band(values: Sequence[float], digits: int = 4) -> dict[str, float]:
    """min / median / max of a series (the noise band we report)."""
    return {
        "min": round(min(values), digits),
        "median": round(statistics.median(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
    }


def write(out: str | None, result: dict[str, Any]) -> None:
    text = json.dumps(result, indent=2, default=str)
    if out:
        Path(out).write_text(text)
    print(text)
