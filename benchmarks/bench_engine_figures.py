"""Figure 8: what the engines' own per-step figures cost (issue #12).

* vLLM: our stat logger's ``record`` per engine iteration, on vLLM's own ``SchedulerStats`` /
  ``IterationStats`` objects (8 requests running, 2 finishing, prefix-cache and spec-decode
  stats filled), with no step open (the common case between steps) and with one open.
* SGLang: one read of its metrics directory (what the poller does when a step opens, once a
  second and when it ends), over Prometheus multiprocess files of the shape a real SGLang 0.5.23
  engine writes (three processes; counters and gauges with its names and labels; histograms
  present but not read). The files are written here with ``prometheus_client`` itself: SGLang is
  not in this environment.

    VPY=$(scripts/engine-env vllm)/bin/python
    $VPY benchmarks/bench_engine_figures.py --out /tmp/figures.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import _common as C

ROUNDS = 31
WRITER = r"""
import os, sys
from prometheus_client import Counter, Gauge, Histogram
labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
values = ["tiny", "unified", "0", "0", "0"]
for name in ("prompt_tokens", "generation_tokens", "num_requests", "cached_tokens",
             "num_retracted_requests", "num_aborted_requests", "realtime_tokens",
             "prefill_effective_tokens", "dp_attention_tokens", "num_so_requests"):
    Counter("sglang:" + name, "", labels).labels(*values).inc(int(sys.argv[1]))
for i in range(40):
    Gauge("sglang:gauge_%d" % i, "", labels, multiprocess_mode="mostrecent").labels(*values).set(i)
for name in ("num_running_reqs", "num_queue_reqs", "token_usage"):
    Gauge("sglang:" + name, "", labels, multiprocess_mode="mostrecent").labels(*values).set(0.5)
for i in range(12):
    Histogram("sglang:hist_%d" % i, "", labels).labels(*values).observe(0.1)
"""


def _vllm_stats() -> tuple[Any, Any]:
    from vllm.v1.metrics.stats import (
        FinishedRequestStats,
        IterationStats,
        PrefixCacheStats,
        SchedulerStats,
    )
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    spec = SpecDecodingStats.new(2)
    spec.observe_draft(2, 1)
    scheduler = SchedulerStats(
        num_running_reqs=8,
        num_waiting_reqs=3,
        kv_cache_usage=0.42,
        prefix_cache_stats=PrefixCacheStats(requests=2, queries=256, hits=128),
        spec_decoding_stats=spec,
    )
    iteration = IterationStats()
    iteration.num_generation_tokens = 8
    iteration.prompt_token_stats.total = 64
    fields = FinishedRequestStats.__dataclass_fields__
    for reason in ("LENGTH", "STOP"):
        from vllm.v1.engine import FinishReason

        kwargs = {k: 0 for k in fields if k not in ("finish_reason",)}
        iteration.finished_requests.append(
            FinishedRequestStats(finish_reason=getattr(FinishReason, reason), **kwargs)
        )
    return scheduler, iteration


def _per_call_us(fn: Any, n: int) -> float:
    t0 = time.thread_time_ns()
    for _ in range(n):
        fn()
    return (time.thread_time_ns() - t0) / n / 1000


def vllm_logger(n: int) -> dict[str, Any]:
    from types import SimpleNamespace

    from otel_rollout import engine_stats
    from otel_rollout.vllm.stat_logger import RolloutStatLogger

    config = SimpleNamespace(model_config=SimpleNamespace(served_model_name="tiny", model="tiny"))
    logger = RolloutStatLogger(config)
    scheduler, iteration = _vllm_stats()

    def call() -> None:
        logger.record(scheduler, iteration)

    closed, opened = [], []
    for _ in range(ROUNDS):
        closed.append(_per_call_us(call, n))
        engine_stats.open_window(1)
        opened.append(_per_call_us(call, n))
        engine_stats.close(1)
    return {"no_step_open_us": C.band(closed), "step_open_us": C.band(opened)}


def sglang_read(rounds: int) -> dict[str, Any]:
    from otel_rollout.sglang.scheduler_metrics import read, totals

    with tempfile.TemporaryDirectory() as directory:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
        for pid_value in (1, 2, 3):  # tokenizer, scheduler, detokenizer
            subprocess.run([sys.executable, "-c", WRITER, str(pid_value)], env=env, check=True)
        files = len(os.listdir(directory))
        per_read = []
        for _ in range(rounds):
            t0 = time.thread_time_ns()
            figures = totals(read(directory), "tiny")
            per_read.append((time.thread_time_ns() - t0) / 1e6)
        assert figures["generation_tokens"] == 6, figures  # 1 + 2 + 3: every process was read
    return {"files": files, "read_ms": C.band(per_read), "cpu_share_at_1_hz": C.band(per_read)}


def run(smoke: bool) -> dict[str, Any]:
    n = 200 if smoke else 5000
    result = {
        "vllm_stat_logger": vllm_logger(n),
        "sglang_poll": sglang_read(5 if smoke else ROUNDS),
        "machine": C.machine(),
    }
    share = result["sglang_poll"]["cpu_share_at_1_hz"]
    for k in share:
        if k != "n":
            share[k] = round(share[k] / 1000, 5)  # ms of CPU per 1,000 ms
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    C.write(args.out, run(args.smoke))


if __name__ == "__main__":
    main()
