"""Figure 10 (issue #16 item 4): what each observer of real vLLM costs per request, side by side.

The same long-tail ``LLM.generate`` (256 requests, fixed seeds, ``ignore_eos``) in one process per
configuration, because vLLM fixes its stat loggers and tracing when the engine is built:

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
``bare``, and wall time as a ratio of ``bare``'s. Processes differ, so the figures carry the
machine's drift between them: configurations run in one pass, then a second pass in reverse
order, and the medians pool both.

SGLang's ``enable_metrics`` and its tracing are not measured here (its scheduler runs in a
process of its own: a different measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import _common as C
from bench_engine import engine_env, model_path

CONFIGS = ("bare", "vllm_stats", "vllm_tracing", "ours", "ours_stats")


def child(config: str, endpoint: str, requests: int, reps: int) -> dict[str, Any]:
    """One configuration, in this process: build the engine, warm up, time ``reps`` generates."""
    from testkit.engines import VLLM_KWARGS

    engine_env()
    kwargs: dict[str, Any] = dict(VLLM_KWARGS)
    if config in ("vllm_stats", "vllm_tracing", "ours_stats"):
        kwargs["disable_log_stats"] = False
    if config == "vllm_tracing":
        kwargs["otlp_traces_endpoint"] = endpoint
    if config.startswith("ours"):
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
    from opentelemetry import metrics, trace
    from vllm import LLM

    llm = LLM(model=os.environ["MODEL"], **kwargs)
    lengths = C.long_tail(requests, seed=7, high=256)
    params = C.make_params(lengths)
    prompts = [f"def task_{i}(x):" for i in range(requests)]

    def flush() -> None:
        from otel_rollout.emitter import flush_all

        flush_all(120)
        for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
            getattr(provider, "force_flush", lambda: None)()

    def once() -> tuple[float, float]:
        c0, w0 = time.process_time(), time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        flush()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        assert [len(o.outputs[0].token_ids) for o in outs] == lengths
        return wall, cpu

    once()
    once()
    walls, cpus = zip(*(once() for _ in range(reps)), strict=True)
    return {"config": config, "requests": requests, "wall_s": list(walls), "cpu_s": list(cpus)}


def run(smoke: bool) -> dict[str, Any]:
    from testkit.otlp_receiver import OTLPReceiver

    requests, reps, passes = (8, 1, 1) if smoke else (256, 3, 2)
    receiver = OTLPReceiver().start()
    env = {**os.environ, "MODEL": model_path()}
    samples: dict[str, dict[str, list[float]]] = {c: {"wall_s": [], "cpu_s": []} for c in CONFIGS}
    try:
        for p in range(passes):
            for config in CONFIGS if p % 2 == 0 else tuple(reversed(CONFIGS)):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", config, "--endpoint",
                     receiver.grpc_endpoint, "--requests", str(requests), "--reps", str(reps)],
                    capture_output=True, text=True, env=env, check=False, timeout=900,
                )  # fmt: skip
                lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
                if out.returncode != 0 or not lines:
                    raise RuntimeError(f"{config} failed:\n{out.stderr[-3000:]}")
                got = json.loads(lines[-1])
                samples[config]["wall_s"] += got["wall_s"]
                samples[config]["cpu_s"] += got["cpu_s"]
                print(config, got, flush=True)
        spans = len(receiver.spans())
    finally:
        receiver.stop()
    base_wall = statistics.median(samples["bare"]["wall_s"])
    base_cpu = statistics.median(samples["bare"]["cpu_s"])
    result: dict[str, Any] = {
        "machine": C.machine(),
        "requests": requests,
        "runs_per_config": reps * passes,
        "spans_received": spans,
        "configs": {},
    }
    for config, got in samples.items():
        wall, cpu = statistics.median(got["wall_s"]), statistics.median(got["cpu_s"])
        result["configs"][config] = {
            "wall_s": C.band(got["wall_s"], 3),
            "cpu_s": C.band(got["cpu_s"], 3),
            "wall_ratio": round(wall / base_wall, 3),
            "cpu_added_us_per_request": round((cpu - base_cpu) / requests * 1e6, 1),
        }
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--child", choices=CONFIGS)
    ap.add_argument("--endpoint")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.endpoint, args.requests, args.reps)), flush=True)
        return
    C.write(args.out, run(args.smoke))


if __name__ == "__main__":
    main()
