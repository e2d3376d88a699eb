"""A real OTLP receiver for tests: gRPC and HTTP/protobuf, on loopback, decoding what arrives.

Tests assert on the bytes that crossed the wire, exactly as a Collector would receive them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class OTLPReceiver:
    """``trace_delay_s``: answer each trace export that much later (a slow but working collector)."""

    def __init__(self, trace_delay_s: float = 0.0) -> None:
        self.trace_delay_s = trace_delay_s
        self.trace_requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.raw: list[bytes] = []
        self._lock = threading.Lock()
        receiver = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                time.sleep(receiver.trace_delay_s)
                receiver._add(request, request.SerializeToString())
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                receiver._add(request, request.SerializeToString())
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._grpc)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.endswith("/v1/traces"):
                    msg: Any = trace_service_pb2.ExportTraceServiceRequest()
                elif self.path.endswith("/v1/metrics"):
                    msg = metrics_service_pb2.ExportMetricsServiceRequest()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                msg.ParseFromString(body)
                receiver._add(msg, body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http_port = self._http.server_address[1]

    def _add(self, msg: Any, raw: bytes) -> None:
        with self._lock:
            self.raw.append(raw)
            if isinstance(msg, trace_service_pb2.ExportTraceServiceRequest):
                self.trace_requests.append(msg)
            else:
                self.metric_requests.append(msg)

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> OTLPReceiver:
        self._grpc.start()
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._grpc.stop(0)
        self._http.shutdown()
        self._http.server_close()

    def spans(self) -> list[Any]:
        with self._lock:
            return [
                s
                for req in self.trace_requests
                for rs in req.resource_spans
                for ss in rs.scope_spans
                for s in ss.spans
            ]

    def metrics(self) -> list[Any]:
        with self._lock:
            return [
                m
                for req in self.metric_requests
                for rm in req.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            ]

    def wait_for(self, predicate: Callable[[OTLPReceiver], bool], timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.1)
        return predicate(self)


def attr(kvs: Any, key: str) -> Any:
    """The python value of an OTLP KeyValue list entry, or None."""
    for kv in kvs:
        if kv.key == key:
            v = kv.value
            which = v.WhichOneof("value")
            if which == "array_value":
                return [getattr(x, x.WhichOneof("value")) for x in v.array_value.values]
            return getattr(v, which) if which else None
    return None
