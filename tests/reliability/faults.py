"""Broken OTLP endpoints for the exporter-trouble tests (FAULT INJECTION, on loopback only).

- ``closed_port()``: a port nothing listens on (connection refused).
- ``FaultyCollector("slow")``: accepts, then sleeps before answering (gRPC and HTTP).
- ``FaultyCollector("error")``: answers gRPC ``UNAVAILABLE`` / HTTP ``503``.
Every HTTP request's headers are recorded, so a test can prove a header really was sent.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FaultyCollector:
    def __init__(self, mode: str, delay: float = 30.0) -> None:
        assert mode in ("slow", "error")
        self.mode, self.delay = mode, delay
        self.requests = 0
        self.headers: list[dict[str, str]] = []
        self.metadata: list[dict[str, str]] = []
        self._stop = threading.Event()
        collector = self

        def answer(context: Any, response: Any) -> Any:
            collector.requests += 1
            collector.metadata.append({k: v for k, v in context.invocation_metadata()})
            if collector.mode == "slow":
                collector._stop.wait(collector.delay)
                return response
            context.abort(grpc.StatusCode.UNAVAILABLE, "FAULT INJECTION: collector unavailable")

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                return answer(context, trace_service_pb2.ExportTraceServiceResponse())

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                return answer(context, metrics_service_pb2.ExportMetricsServiceResponse())

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._grpc)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                collector.requests += 1
                collector.headers.append({k.lower(): v for k, v in self.headers.items()})
                if collector.mode == "slow":
                    collector._stop.wait(collector.delay)
                    code = 200
                else:
                    code = 503
                try:
                    self.send_response(code)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.http_port = self._http.server_address[1]

    def endpoint(self, protocol: str) -> str:
        return f"http://127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"

    def start(self) -> FaultyCollector:
        self._grpc.start()
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._grpc.stop(0)
        self._http.shutdown()
        self._http.server_close()


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())
