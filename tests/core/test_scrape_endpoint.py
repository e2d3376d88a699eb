"""The direct-scrape endpoint as a node with several workers meets it (issue #20).

Real processes, real sockets, real HTTP scrapes: two processes with the same settings must both
serve, each on a port of its own inside the documented range, on the interface
``OTEL_EXPORTER_PROMETHEUS_HOST`` names; a Ray worker set up by ``setup_worker`` (the distro's
configurator) must accept ``OTEL_METRICS_EXPORTER=rollout_prometheus``.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from otel_rollout.exposition import PORT_RANGE
from tests.conftest import REPO

READER_CHILD = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from opentelemetry.sdk.metrics import MeterProvider
from otel_rollout.exposition import OpenMetricsExemplarReader
reader = OpenMetricsExemplarReader()
provider = MeterProvider(metric_readers=[reader])
provider.get_meter("dayone").create_counter("dayone.processes").add(1, {"worker": sys.argv[1]})
print(reader.port, flush=True)
sys.stdin.read()
"""

WORKER_CHILD = """
import sys
from otel_rollout.ray import setup_worker
setup_worker()
from opentelemetry import metrics
metrics.get_meter("dayone").create_counter("dayone.worker.calls").add(3)
print("ready", flush=True)
sys.stdin.read()
"""


def _free_range(width: int) -> int:
    """A base port whose next ``width`` ports are all free on every interface right now."""
    for _ in range(200):
        base = random.randint(20000, 60000 - width)
        socks = []
        try:
            for port in range(base, base + width):
                s = socket.socket()
                socks.append(s)
                s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    pytest.fail("no free port range")


@contextmanager
def _child(code: str, env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    full = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=full,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line:
        proc.kill()
        pytest.fail(f"child printed nothing; stderr:\n{proc.communicate(timeout=10)[1]}")
    return line


def _scrape(host: str, port: int) -> str:
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
                assert resp.status == 200
                return str(resp.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _other_loopback_reachable() -> bool:
    """127.0.0.2 reaches a socket bound to 0.0.0.0 (not one bound to 127.0.0.1) on Linux."""
    try:
        socket.socket().bind(("127.0.0.2", 0))
        return True
    except OSError:
        return False


def test_two_processes_with_the_same_settings_both_serve() -> None:
    base = _free_range(PORT_RANGE)
    env = {"OTEL_EXPORTER_PROMETHEUS_HOST": "0.0.0.0", "OTEL_EXPORTER_PROMETHEUS_PORT": str(base)}
    with _child(READER_CHILD, env, "a") as first, _child(READER_CHILD, env, "b") as second:
        port_a = int(_first_line(first))
        port_b = int(_first_line(second))
        assert port_a != port_b
        assert {port_a, port_b} <= set(range(base, base + PORT_RANGE))
        # Reachable on the configured interface (all of them): not only through 127.0.0.1.
        host = "127.0.0.2" if _other_loopback_reachable() else "127.0.0.1"
        body_a, body_b = _scrape(host, port_a), _scrape(host, port_b)
        assert 'dayone_processes_total{worker="a"} 1.0' in body_a
        assert 'dayone_processes_total{worker="b"} 1.0' in body_b
        first.kill()
        second.kill()
        logs = first.communicate(timeout=10)[1] + second.communicate(timeout=10)[1]
    # The port each process took is logged once; the one that moved says why.
    moved = max(port_a, port_b)
    assert logs.count(f"serving metrics on http://0.0.0.0:{moved}/metrics") == 1, logs
    assert f"port {base} is taken by another process" in logs, logs


def test_port_zero_takes_any_free_port_and_logs_it() -> None:
    env = {"OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1", "OTEL_EXPORTER_PROMETHEUS_PORT": "0"}
    with _child(READER_CHILD, env, "z") as proc:
        port = int(_first_line(proc))
        assert port > 0
        assert 'worker="z"' in _scrape("127.0.0.1", port)
        proc.kill()
        logs = proc.communicate(timeout=10)[1]
    assert f"serving metrics on http://127.0.0.1:{port}/metrics (any free port" in logs, logs


def test_setup_worker_accepts_the_rollout_prometheus_exporter() -> None:
    """What a Ray worker's set-up hook does, in a plain process: the distro's configurator picks
    our exporter from OTEL_METRICS_EXPORTER through its entry point, and /metrics answers."""
    port = _free_range(PORT_RANGE)
    env = {
        "OTEL_METRICS_EXPORTER": "rollout_prometheus",
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
    }
    with _child(WORKER_CHILD, env) as proc:
        assert _first_line(proc) == "ready"
        body = _scrape("127.0.0.1", port)
    assert "dayone_worker_calls_total 3.0" in body, body[:2000]
