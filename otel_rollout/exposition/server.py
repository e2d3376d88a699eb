"""The ``/metrics`` HTTP server: a port of the node's range, format negotiation.

Several processes on one node (Ray workers, one per engine) read the same settings; the first
takes the configured port, the next ones the ports after it, so one scrape config over the range
finds every process.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

_logger = logging.getLogger("otel_rollout.exposition")

DEFAULT_PORT = 9464
"""The standard ``OTEL_EXPORTER_PROMETHEUS_PORT`` default."""
PORT_RANGE = 16
"""When the configured port is taken, the next ``PORT_RANGE - 1`` are tried (9464–9479 by
default): one port per process, for up to 16 processes per node. Scrape the whole range."""


def serve(host: str | None, port: int | None, app: Callable[..., Any]) -> WSGIServer | None:
    """Listen on the configured port, or the next free one of :data:`PORT_RANGE`.

    ``0`` asks the OS for any free port. Either way the port actually served is logged once, so
    a scrape config (static targets over the range, see prometheus/prometheus.yml) or a person
    can find it. ``None`` (after one error naming host and ports) when nothing could be bound.
    """
    host = host or os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
    raw_port = (
        os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", str(DEFAULT_PORT)) if port is None else port
    )
    try:
        wanted = int(raw_port)
        if not 0 <= wanted <= 65535:
            raise ValueError(raw_port)
    except ValueError:
        _logger.warning(
            "otel_rollout: OTEL_EXPORTER_PROMETHEUS_PORT=%r is not a port; using %d instead",
            raw_port,
            DEFAULT_PORT,
        )
        wanted = DEFAULT_PORT
    candidates = [0] if wanted == 0 else list(range(wanted, min(wanted + PORT_RANGE, 65536)))
    error: OSError | None = None
    server: WSGIServer | None = None
    for candidate in candidates:
        try:
            server = start_server(host, candidate, app)
            break
        except OSError as exc:
            error = exc
            if exc.errno != errno.EADDRINUSE:
                break  # an unknown host, no permission: the next port will not help
    if server is None:
        last = candidates[-1]
        _logger.error(
            "otel_rollout: cannot serve metrics on %s:%s%s (%s); metrics are still "
            "collected but nobody can scrape them",
            host,
            wanted,
            f"..{last}" if last != wanted else "",
            error,
        )
        return None
    served = server.server_port
    if served == wanted:
        _logger.info("otel_rollout: serving metrics on http://%s:%d/metrics", host, served)
    else:
        _logger.warning(
            "otel_rollout: serving metrics on http://%s:%d/metrics (%s)",
            host,
            served,
            "any free port, as OTEL_EXPORTER_PROMETHEUS_PORT=0 asks"
            if wanted == 0
            else f"port {wanted} is taken by another process",
        )
    return server


def wants_protobuf(accept: str) -> bool:
    """True if the scraper ranks Prometheus' delimited protobuf above every text format."""
    best_proto, best_text = -1.0, -1.0
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media, params = fields[0].lower(), fields[1:]
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media == "application/vnd.google.protobuf":
            joined = ";".join(p.replace(" ", "") for p in params)
            if "proto=io.prometheus.client.MetricFamily" in joined and (
                "encoding=delimited" in joined
            ):
                best_proto = max(best_proto, q)
        elif media:
            best_text = max(best_text, q)
    return best_proto > 0 and best_proto >= best_text


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


def start_server(host: str, port: int, app: Callable[..., Any]) -> WSGIServer:
    """A threaded WSGI server on (host, port), IPv4 or IPv6 as the host resolves."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    server_class = type(
        "_MetricsServer",
        (ThreadingMixIn, WSGIServer),
        {"daemon_threads": True, "address_family": family},
    )
    server: WSGIServer = make_server(
        str(sockaddr[0]), port, app, server_class, handler_class=_QuietHandler
    )
    threading.Thread(target=server.serve_forever, name="otel-rollout-metrics", daemon=True).start()
    return server
