"""Engine servers for the server suite: one per test module (module-scoped fixtures), started
by :mod:`testkit.servers` as their users start them, under ``opentelemetry-instrument``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.otlp_receiver import OTLPReceiver
from testkit.servers import (
    Server,
    free_port,
    require_in_server,
    server_env,
    server_python,
    sglang_server,
    start_server,
    stop_server,
    vllm_server,
)

__all__ = [
    "Server",
    "free_port",
    "require_in_server",
    "server_env",
    "server_python",
    "sglang_server",
    "start_server",
    "stop_server",
    "vllm_server",
]


@pytest.fixture
def http_client_hook() -> Iterator[None]:
    """The client side of an HTTP job, hooked for one test (the servers are hooked by their own
    `opentelemetry-instrument`)."""
    from otel_rollout.http import HTTPClientInstrumentor

    hook = HTTPClientInstrumentor()
    hook.instrument()
    yield
    hook.uninstrument()


@pytest.fixture
def step_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the step log of the test's steps goes."""
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv("OTEL_ROLLOUT_STEP_LOG", str(path))
    return path


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    """One OTLP receiver per module: the module's server exports to it for its whole life."""
    rec = OTLPReceiver().start()
    yield rec
    rec.stop()


@pytest.fixture(scope="module")
def server_log(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    return tmp_path_factory.mktemp("server") / f"{request.module.__name__.rsplit('.', 1)[-1]}.log"
