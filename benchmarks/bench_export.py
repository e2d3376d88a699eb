"""Figure 5: export pressure — generate latency and process exit with the OTLP endpoint unhealthy.

Each configuration runs in its own child process, set up the way a training job sets itself up
with this package: ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``otel_rollout.sdk.configure_from_environment()`` (SDK
providers, BatchSpanProcessor and PeriodicExportingMetricReader over OTLP/gRPC), then
``VLLMInstrumentor().instrument()``. Span batches are sent every 0.5 s and metrics every 1 s so the
exporters are busy while generate runs. Endpoints:

* ``bare``: no SDK, no instrumentation (the reference for exit time);
* ``healthy``: a real OTLP/gRPC receiver on loopback (the reference for generate latency);
* ``refused``: a closed port (connection refused at once, exporters retry with backoff);
* ``blackhole``: a TCP port that accepts connections and never answers (every export waits for
  its deadline);
* ``slow``: an OTLP/gRPC receiver that takes 3 s to answer each export.

The child runs K generate calls (real ``LLM`` on CPU, or with ``--fake`` a stand-in that sleeps
like an engine and emits the same records through the real telemetry path), prints its latencies
and a DONE line, and returns from ``main``; the parent timestamps DONE and the child's exit. The
exit time is therefore what the interpreter's shutdown (atexit handlers: provider shutdown,
exporter flush and retries, engine shutdown) adds after the job's last line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures
from typing import Any

import _common as C

HERE = os.path.dirname(os.path.abspath(__file__))


# --- endpoints -----------------------------------------------------------------------------------


def slow_receiver(delay_s: float) -> tuple[Any, int]:
    import grpc
    from opentelemetry.proto.collector.metrics.v1 import (
        metrics_service_pb2,
        metrics_service_pb2_grpc,
    )
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            time.sleep(delay_s)
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            time.sleep(delay_s)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def blackhole() -> tuple[socket.socket, int]:
    """Accepts TCP connections (kernel backlog + an accept loop) and never sends a byte."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return s, s.getsockname()[1]


# --- the child: one configuration -------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    if args.endpoint != "none":
        os.environ.update(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": args.endpoint,
                "OTEL_EXPORTER_OTLP_INSECURE": "true",
                "OTEL_BSP_SCHEDULE_DELAY": "500",
                "OTEL_METRIC_EXPORT_INTERVAL": "1000",
            }
        )
        from otel_rollout import VLLMInstrumentor
        from otel_rollout.sdk import configure_from_environment

        configure_from_environment()
    if args.fake:
        import vllm  # noqa: F401  (instrument() imports it; bare must pay the same exit cost)

        gen = fake_generate(args.endpoint != "none", args.requests)
    else:
        gen = real_generate(args.requests)
    if args.endpoint != "none":
        VLLMInstrumentor().instrument()
    gen()  # warm-up
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        gen()
        times.append(time.perf_counter() - t0)
    print("RESULT " + json.dumps({"generate_s": times}), flush=True)
    print("DONE", flush=True)


def real_generate(n: int) -> Any:
    from bench_engine import engine_env, model_path

    engine_env()
    from vllm import LLM

    from testkit.engines import VLLM_KWARGS

    llm = LLM(model=model_path(), **VLLM_KWARGS)
    lengths = C.long_tail(n, seed=5, high=128)
    params = C.make_params(lengths)
    prompts = [f"def task_{i}(x):" for i in range(n)]
    return lambda: llm.generate(prompts, params, use_tqdm=False)


def fake_generate(instrumented: bool, n: int) -> Any:
    """No vLLM import: an 80 ms 'engine' followed by the telemetry of n finished requests."""
    from otel_rollout.record import RequestRecord

    telemetry = None
    if instrumented:
        from otel_rollout.instrumentation import build_telemetry

        telemetry = build_telemetry("vllm", {})

    def gen() -> None:
        time.sleep(0.08)
        if telemetry is None:
            return
        now = time.time_ns()
        with telemetry.batch("tiny", "text_completion", n) as ctx:
            telemetry.emit_all(
                [
                    RequestRecord(
                        provider="vllm",
                        model="tiny",
                        operation="text_completion",
                        arrival_ns=now - 10**8,
                        finish_ns=now,
                        first_token_ns=now - 9 * 10**7,
                        request_id=str(i),
                        prompt_tokens=12,
                        output_tokens=30,
                        finish_reasons=("length",),
                    )
                    for i in range(n)
                ],
                ctx,
            )

    return gen


# --- the parent --------------------------------------------------------------------------------------


def run_child(
    endpoint: str, fake: bool, runs: int, requests: int, limit_s: float
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        os.path.join(HERE, "bench_export.py"),
        "--child",
        "--endpoint",
        endpoint,
        "--runs",
        str(runs),
        "--requests",
        str(requests),
    ] + (["--fake"] if fake else [])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    result: dict[str, Any] = {}
    done_at = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("RESULT "):
            result.update(json.loads(line[7:]))
        elif line.startswith("DONE"):
            done_at = time.monotonic()
            break
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        result["killed_after_s"] = limit_s
    end = time.monotonic()
    if done_at is None:
        raise RuntimeError(f"child for {endpoint} failed (rc={proc.returncode})")
    result["exit_s"] = round(end - done_at, 3)
    result["total_s"] = round(end - start, 1)
    result["median_generate_s"] = round(statistics.median(result["generate_s"]), 4)
    result["generate_s"] = [round(x, 4) for x in result["generate_s"]]
    return result


def run(smoke: bool, fake: bool | None = None) -> dict[str, Any]:
    from testkit.otlp_receiver import OTLPReceiver

    fake = smoke if fake is None else fake
    runs, requests = (1, 16) if smoke else (5, 256)
    healthy = OTLPReceiver().start()
    slow, slow_port = slow_receiver(3.0)
    hole, hole_port = blackhole()
    endpoints = {
        "bare": "none",
        "healthy": healthy.grpc_endpoint,
        "refused": f"http://127.0.0.1:{closed_port()}",
        "blackhole": f"http://127.0.0.1:{hole_port}",
        "slow": f"http://127.0.0.1:{slow_port}",
    }
    if smoke:
        endpoints = {k: endpoints[k] for k in ("bare", "healthy")}
    results: dict[str, Any] = {
        "machine": C.machine(),
        "engine": "fake" if fake else "vllm",
        "runs": runs,
        "requests": requests,
        "configs": {},
    }
    try:
        for name, endpoint in endpoints.items():
            res = run_child(endpoint, fake, runs, requests, limit_s=120)
            results["configs"][name] = res
            print(name, res, flush=True)
    finally:
        healthy.stop()
        slow.stop(0)
        hole.close()
    cfg = results["configs"]
    base_exit = cfg["bare"]["exit_s"]
    ref = cfg["healthy"]["median_generate_s"]
    for name, res in cfg.items():
        res["exit_beyond_bare_s"] = round(res["exit_s"] - base_exit, 3)
        if name != "bare":
            res["generate_ratio_vs_healthy"] = round(res["median_generate_s"] / ref, 4)
    results["received_spans_healthy"] = sum(
        len(ss.spans)
        for req in healthy.trace_requests
        for rs in req.resource_spans
        for ss in rs.scope_spans
    )
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--fake", action="store_true", help="stand-in engine instead of real vLLM")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--endpoint")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    C.write(args.out, run(args.smoke, True if args.fake else None))


if __name__ == "__main__":
    main()
