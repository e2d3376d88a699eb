"""SGLang's HTTP server with its own tracing on: its ``Req`` span joins too, ours stays one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.otlp_receiver import OTLPReceiver
from tests.conftest import require_module
from tests.servers.checks import check_joined, check_root, send_plain, send_rollout
from tests.servers.conftest import Server, sglang_server, stop_server

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def server(tiny_model: str, receiver: OTLPReceiver, server_log: Path) -> Iterator[Server]:
    require_module("sglang")
    srv = sglang_server(tiny_model, receiver, server_log, engine_tracing=True)
    yield srv
    stop_server(srv)


def test_requests_join_beside_sglangs_own_spans(server: Server, receiver: OTLPReceiver) -> None:
    calls = send_rollout(server.url, server.model)
    check_joined(receiver, "sglang", calls, via_server_span=False)

    def roots(r: OTLPReceiver) -> list[Any]:  # SGLang's per-request root span: "<role> Req <rid>"
        return [s for s in r.spans() if "Req " in s.name]

    receiver.wait_for(lambda r: len(roots(r)) >= len(calls), timeout=20)
    for call in calls:
        theirs = [
            s
            for s in roots(receiver)
            if s.trace_id.hex() == call.trace_id and s.parent_span_id.hex() == call.span_id
        ]
        assert len(theirs) == 1, (call, [s.name for s in roots(receiver)])


def test_request_without_headers_is_a_root(server: Server, receiver: OTLPReceiver) -> None:
    check_root(receiver, "sglang", send_plain(server.url, server.model), via_server_span=False)
