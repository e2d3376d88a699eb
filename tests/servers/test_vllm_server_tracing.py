"""vLLM's OpenAI server with its own tracing on: its ``llm_request`` joins too, ours stays one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.otlp_receiver import OTLPReceiver
from tests.conftest import require_module
from tests.servers.checks import check_joined, check_root, send_plain, send_rollout
from tests.servers.conftest import Server, stop_server, vllm_server

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def server(tiny_model: str, receiver: OTLPReceiver, server_log: Path) -> Iterator[Server]:
    require_module("vllm")
    srv = vllm_server(tiny_model, receiver, server_log, engine_tracing=True)
    yield srv
    stop_server(srv)


def test_requests_join_beside_vllms_own_spans(server: Server, receiver: OTLPReceiver) -> None:
    calls = send_rollout(server.url, server.model)
    check_joined(receiver, "vllm", calls, via_server_span=False)
    receiver.wait_for(
        lambda r: len([s for s in r.spans() if s.name == "llm_request"]) >= len(calls), timeout=20
    )
    engine_spans = [s for s in receiver.spans() if s.name == "llm_request"]
    for call in calls:
        theirs = [
            s
            for s in engine_spans
            if s.trace_id.hex() == call.trace_id and s.parent_span_id.hex() == call.span_id
        ]
        assert len(theirs) == 1, (
            call,
            sorted({s.name for s in receiver.spans()}),
            [(s.trace_id.hex(), s.parent_span_id.hex()) for s in engine_spans],
        )


def test_request_without_headers_is_a_root(server: Server, receiver: OTLPReceiver) -> None:
    check_root(receiver, "vllm", send_plain(server.url, server.model), via_server_span=False)
