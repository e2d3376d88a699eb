"""SGLang's HTTP server with its own tracing off: requests join the caller's trace and step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.otlp_receiver import OTLPReceiver
from tests.conftest import require_module
from tests.servers.checks import (
    check_batch,
    check_joined,
    check_root,
    send_batch,
    send_plain,
    send_rollout,
)
from tests.servers.conftest import Server, sglang_server, stop_server

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def server(tiny_model: str, receiver: OTLPReceiver, server_log: Path) -> Iterator[Server]:
    require_module("sglang")
    srv = sglang_server(tiny_model, receiver, server_log)
    yield srv
    stop_server(srv)


def test_requests_join_the_callers_trace_and_step(server: Server, receiver: OTLPReceiver) -> None:
    calls = send_rollout(server.url, server.model)
    check_joined(receiver, "sglang", calls, via_server_span=False)
    # SGLang's own tracing is off: none of its per-request "Req" spans.
    assert not [s for s in receiver.spans() if "Req " in s.name]


def test_request_without_headers_is_a_root(server: Server, receiver: OTLPReceiver) -> None:
    check_root(receiver, "sglang", send_plain(server.url, server.model), via_server_span=False)


def test_a_list_of_prompts_is_one_span_per_prompt(server: Server, receiver: OTLPReceiver) -> None:
    check_batch(receiver, "sglang", send_batch(server.url, server.model))
