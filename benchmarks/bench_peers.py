"""Figure 10 (issue #16 item 4): what each observer of a real engine costs per request, side by side.

vLLM (``--engine vllm``, the default): the same long-tail ``LLM.generate`` (256 requests, fixed
seeds, ``ignore_eos``) in one process per configuration, because vLLM fixes its stat loggers and
tracing when the engine is built:

* ``bare``: vLLM's defaults for ``LLM`` (engine stats off);
* ``vllm_stats``: ``disable_log_stats=False``: vLLM's own stat loggers (its log line and its
  Prometheus metrics) and per-request stats;
* ``vllm_tracing``: the same plus vLLM's own request spans (``otlp_traces_endpoint``);
* ``ours``: vLLM's defaults, and otel_rollout set up as ``opentelemetry-instrument`` sets it up
  (``otel_rollout.sdk.configure_from_environment``: OTLP spans and metrics, every installed
  instrumentor);
* ``ours_stats``: ours with ``disable_log_stats=False``.

Spans go over OTLP/gRPC to a receiver in the parent process (its CPU is not counted). Each child
warms up twice, then times ``reps`` generates: wall time, and process CPU (the engine core runs
in-process here, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) including a flush of every provider, so
the export work is inside. Reported per configuration: medians, CPU per request added over
``bare``, each named thread's share (:data:`THREADS`), and wall time as a ratio of ``bare``'s.
The engine's own CPU on the main thread spreads by about ±550 µs a request between runs of one
configuration (256 requests), so the process figure orders nothing finer; a thread that is ours
alone (the emitter) is measured apart from it. Processes differ, so the figures carry the
machine's drift between them: configurations run in one pass, then a second pass in reverse
order, and the medians pool both.

SGLang (``--engine sglang``): the same requests through ``Engine.generate``, one process per
configuration:

* ``bare``: SGLang's defaults (``enable_metrics`` and tracing off);
* ``sglang_metrics``: ``enable_metrics=True``: its Prometheus metrics and per-request timeline;
* ``sglang_tracing``: ``enable_trace=True``: its own request spans, over OTLP/gRPC to the same
  receiver (tracing alone: in SGLang it does not need the metrics);
* ``ours`` and ``ours_metrics``: otel_rollout as for vLLM, without and with ``enable_metrics``.

SGLang's scheduler and detokenizer run in processes of their own, so CPU is the whole process
tree's (``psutil``: this process and its children). Its scheduler exports its spans from its own
process, every 100 ms here (``SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS``, 500 by default), so
each configuration waits the same settle time after a generate and its flush before CPU is read:
that export is inside, and wall time stops when the generate returns.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import _common as C
from bench_engine import engine_env, model_path

CONFIGS = {
    "vllm": ("bare", "vllm_stats", "vllm_tracing", "ours", "ours_stats"),
    "sglang": ("bare", "sglang_metrics", "sglang_tracing", "ours", "ours_metrics"),
}
SETTLE_S = 0.5
"""SGLang: the wait after a generate (and the flush) for its scheduler's own span exports."""
THREADS = {
    "main": "MainThread",
    "emitter": "otel_rollout",
    "span_export": "OtelBatchSpanRecordProcessor",
    "metric_export": "OtelPeriodicExportingMetricReader",
}
"""Where a configuration's CPU goes in the process that runs the generate: its threads, by the
name's start. ``emitter``: otel_rollout's own threads (``otel_rollout-*``: the background
emitter, the stall watch, a pacer's drain); the SDK's span and metric export; ``rest``: every
other thread (the engine's, gRPC's), and threads that ended in between."""


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's named threads (``THREADS``), from the kernel's
    per-thread counters (``psutil``)."""
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    out = dict.fromkeys(THREADS, 0.0)
    for thread in psutil.Process().threads():
        name = names.get(thread.id, "")
        for group, prefix in THREADS.items():
            if name.startswith(prefix):
                out[group] += thread.user_time + thread.system_time
                break
    return out


def split(before: dict[str, float], after: dict[str, float], cpu: float) -> dict[str, float]:
    """The named threads' share of ``cpu`` (the process's, over the same interval), and the rest."""
    shares = {group: after[group] - before[group] for group in THREADS}
    shares["rest"] = cpu - sum(shares.values())
    return shares


def workload(requests: int) -> tuple[list[int], list[str]]:
    """The response lengths (long-tailed, fixed seed) and prompts every configuration runs."""
    return C.long_tail(requests, seed=7, high=256), [f"def task_{i}(x):" for i in range(requests)]


def timed(once: Callable[[], tuple[Any, ...]], reps: int, keys: tuple[str, ...]) -> dict[str, Any]:
    """Two warm-up calls of ``once``, then ``reps`` timed ones: each of its results listed under
    its key."""
    once()
    once()
    runs = zip(*(once() for _ in range(reps)), strict=True)
    return {key: list(values) for key, values in zip(keys, runs, strict=True)}


def configure_ours(endpoint: str) -> None:
    """otel_rollout as ``opentelemetry-instrument`` sets it up: OTLP spans and metrics."""
    os.environ.update(
        {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_LOGS_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_SERVICE_NAME": "bench-peers",
        }
    )
    from otel_rollout.sdk import configure_from_environment

    assert configure_from_environment(), "the SDK was not configured"


def flush_providers() -> None:
    from opentelemetry import metrics, trace

    from otel_rollout.emitter import flush_all

    flush_all(120)
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        getattr(provider, "force_flush", lambda: None)()


def child(engine: str, config: str, endpoint: str, requests: int, reps: int) -> dict[str, Any]:
    """One configuration, in this process: build the engine, warm up, time ``reps`` generates."""
    if engine == "sglang":
        return sglang_child(config, endpoint, requests, reps)
    from testkit.engines import VLLM_KWARGS

    engine_env()
    kwargs: dict[str, Any] = dict(VLLM_KWARGS)
    if config in ("vllm_stats", "vllm_tracing", "ours_stats"):
        kwargs["disable_log_stats"] = False
    if config == "vllm_tracing":
        kwargs["otlp_traces_endpoint"] = endpoint
    if config.startswith("ours"):
        configure_ours(endpoint)
    from vllm import LLM

    llm = LLM(model=os.environ["MODEL"], **kwargs)
    lengths, prompts = workload(requests)
    params = C.make_params(lengths)

    def once() -> tuple[float, float, dict[str, float]]:
        t0, c0, w0 = thread_cpu(), time.process_time(), time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        flush_providers()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        assert [len(o.outputs[0].token_ids) for o in outs] == lengths
        return wall, cpu, split(t0, thread_cpu(), cpu)

    runs = timed(once, reps, ("wall_s", "cpu_s", "threads_cpu_s"))
    return {"config": config, "requests": requests, **runs}


def sglang_child(config: str, endpoint: str, requests: int, reps: int) -> dict[str, Any]:
    import psutil

    from testkit.engines import sglang_environment, sglang_kwargs

    sglang_environment()
    os.environ["SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS"] = "100"
    kwargs: dict[str, Any] = sglang_kwargs()
    if config in ("sglang_metrics", "ours_metrics"):
        kwargs["enable_metrics"] = True
    if config == "sglang_tracing":
        kwargs.update(enable_trace=True, otlp_traces_endpoint=endpoint.removeprefix("http://"))
    if config.startswith("ours"):
        configure_ours(endpoint)
    import sglang

    engine = sglang.Engine(model_path=os.environ["MODEL"], **kwargs)
    lengths, prompts = workload(requests)
    params = [{"max_new_tokens": n, "ignore_eos": True, "temperature": 0.7} for n in lengths]
    me = psutil.Process()

    def tree_cpu() -> float:
        total = 0.0
        for proc in (me, *me.children(recursive=True)):
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def once() -> tuple[float, float, float, dict[str, float]]:
        t0, c0, d0, w0 = thread_cpu(), tree_cpu(), time.process_time(), time.perf_counter()
        outs = engine.generate(prompt=prompts, sampling_params=params)
        wall = time.perf_counter() - w0
        flush_providers()
        time.sleep(SETTLE_S)
        cpu, driver = tree_cpu() - c0, time.process_time() - d0
        assert [o["meta_info"]["completion_tokens"] for o in outs] == lengths
        return wall, cpu, driver, split(t0, thread_cpu(), driver)

    try:
        runs = timed(once, reps, ("wall_s", "cpu_s", "driver_cpu_s", "threads_cpu_s"))
    finally:
        engine.shutdown()
    return {"config": config, "requests": requests, **runs}


def run(smoke: bool, engine: str = "vllm") -> dict[str, Any]:
    from testkit.otlp_receiver import OTLPReceiver

    configs = CONFIGS[engine]
    requests, reps, passes = (8, 1, 1) if smoke else (256, 3, 2)
    receiver = OTLPReceiver().start()
    env = {**os.environ, "MODEL": model_path()}
    keys = ("wall_s", "cpu_s", "driver_cpu_s") if engine == "sglang" else ("wall_s", "cpu_s")
    samples = {c: {k: list[float]() for k in keys} for c in configs}
    threads: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    span_counts, seen = dict.fromkeys(configs, 0), 0
    try:
        for p in range(passes):
            for config in configs if p % 2 == 0 else tuple(reversed(configs)):
                out = subprocess.run(
                    [sys.executable, __file__, "--engine", engine, "--child", config, "--endpoint",
                     receiver.grpc_endpoint, "--requests", str(requests), "--reps", str(reps)],
                    capture_output=True, text=True, env=env, check=False, timeout=900,
                )  # fmt: skip
                lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
                if out.returncode != 0 or not lines:
                    raise RuntimeError(f"{config} failed:\n{out.stderr[-3000:]}")
                got = json.loads(lines[-1])
                for key in keys:
                    samples[config][key] += got[key]
                threads[config] += got["threads_cpu_s"]
                received = len(receiver.spans())
                span_counts[config] += received - seen
                seen = received
                print(config, got, flush=True)
        spans = len(receiver.spans())
    finally:
        receiver.stop()
    base_wall = statistics.median(samples["bare"]["wall_s"])
    base_cpu = statistics.median(samples["bare"]["cpu_s"])
    result: dict[str, Any] = {
        "machine": C.machine(),
        "engine": engine,
        "requests": requests,
        "runs_per_config": reps * passes,
        "spans_received": spans,
        "configs": {},
    }
    for config, got in samples.items():
        wall, cpu = statistics.median(got["wall_s"]), statistics.median(got["cpu_s"])
        row = result["configs"][config] = {
            "wall_s": C.band(got["wall_s"], 3),
            "cpu_s": C.band(got["cpu_s"], 3),
            "wall_ratio": round(wall / base_wall, 3),
            "cpu_added_us_per_request": round((cpu - base_cpu) / requests * 1e6, 1),
            "spans_received": span_counts[config],
        }
        row["threads_cpu_added_us_per_request"] = {
            group: round(
                (
                    statistics.median(t[group] for t in threads[config])
                    - statistics.median(t[group] for t in threads["bare"])
                )
                / requests
                * 1e6,
                1,
            )
            for group in (*THREADS, "rest")
        }
        if "driver_cpu_s" in got:  # SGLang: the process that holds its tokenizer manager (and us)
            driver, base = (statistics.median(samples[c]["driver_cpu_s"]) for c in (config, "bare"))
            row["driver_cpu_s"] = C.band(got["driver_cpu_s"], 3)
            row["driver_cpu_added_us_per_request"] = round((driver - base) / requests * 1e6, 1)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--engine", choices=tuple(CONFIGS), default="vllm")
    ap.add_argument("--child")
    ap.add_argument("--endpoint")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.child:
        if args.child not in CONFIGS[args.engine]:
            ap.error(
                f"--child {args.child!r}: not a {args.engine} configuration {CONFIGS[args.engine]}"
            )
        got = child(args.engine, args.child, args.endpoint, args.requests, args.reps)
        print(json.dumps(got), flush=True)
        return
    C.write(args.out, run(args.smoke, args.engine))


if __name__ == "__main__":
    main()
