"""vLLM's OpenAI server with FastAPI instrumentation beside ours: its server span is the parent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.otlp_receiver import OTLPReceiver
from tests.conftest import require_module
from tests.servers.checks import check_joined, check_root, send_plain, send_rollout
from tests.servers.conftest import Server, require_in_server, stop_server, vllm_server

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def server(tiny_model: str, receiver: OTLPReceiver, server_log: Path) -> Iterator[Server]:
    require_module("vllm")
    require_in_server("opentelemetry.instrumentation.fastapi")
    srv = vllm_server(tiny_model, receiver, server_log, fastapi=True)
    yield srv
    stop_server(srv)


def test_one_request_span_under_the_server_span(server: Server, receiver: OTLPReceiver) -> None:
    calls = send_rollout(server.url, server.model)
    check_joined(receiver, "vllm", calls, via_server_span=True)


def test_request_without_headers_is_under_a_root_server_span(
    server: Server, receiver: OTLPReceiver
) -> None:
    check_root(receiver, "vllm", send_plain(server.url, server.model), via_server_span=True)
