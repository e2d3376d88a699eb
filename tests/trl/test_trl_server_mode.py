"""TRL's server mode, its client side (issue #41): TRL's own ``VLLMClient.generate`` — what
``GRPOTrainer(vllm_mode="server")`` calls each round — against a real vLLM OpenAI server under
``opentelemetry-instrument``, inside a step.

TRL's trainer in server mode syncs weights over NCCL (``VLLMClient.init_communicator``), which
this CPU machine does not have: the trainer itself is not run here, its generation call is. It
POSTs one batch of prompts (``requests``); the step counts one request per prompt with the
tokens the server returned, and the server's request spans are in the step's trace.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.otlp_receiver import OTLPReceiver, attr
from testkit.servers import Server, request_spans, stop_server, vllm_server
from tests.conftest import OTelHarness

pytestmark = pytest.mark.trl


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    rec = OTLPReceiver().start()
    yield rec
    rec.stop()


@pytest.fixture(scope="module")
def server(
    trl_module: Any, tiny_model: str, receiver: OTLPReceiver, tmp_path_factory: Any
) -> Iterator[Server]:
    srv = vllm_server(tiny_model, receiver, tmp_path_factory.mktemp("server") / "vllm.log")
    yield srv
    stop_server(srv)


@pytest.fixture
def http_client_hook() -> Iterator[None]:
    from otel_rollout.http import HTTPClientInstrumentor

    hook = HTTPClientInstrumentor()
    hook.instrument()
    yield
    hook.uninstrument()


def test_trls_vllm_client_generation_counts_in_the_step(
    server: Server, receiver: OTLPReceiver, otel: OTelHarness, http_client_hook: None
) -> None:
    from trl.generation.vllm_client import VLLMClient

    from otel_rollout import rollout_step

    client = VLLMClient(base_url=server.url, connection_timeout=60)
    prompts = ["Question 1: what comes after 1?", "Question 2: what comes after 2?"]
    with rollout_step(12) as scope:
        out = client.generate(prompts, n=4, max_tokens=6, generation_kwargs={"ignore_eos": True})
    assert len(out["completion_ids"]) == len(prompts) * 4
    stats = scope.stats
    assert stats is not None and stats.requests == len(prompts)  # one engine request a prompt
    step = [s for s in otel.finished_spans() if s.name == "rollout.step"][0]
    trace_id = format(step.context.trace_id, "032x")

    def served(r: OTLPReceiver) -> list[Any]:
        return [s for s in request_spans(r, "vllm") if s.trace_id.hex() == trace_id]

    assert receiver.wait_for(lambda r: len(served(r)) >= len(prompts), timeout=30)
    time.sleep(1.0)  # > the server's 200 ms batch delay: a span too many would be here by now
    spans = served(receiver)
    assert len(spans) == len(prompts)
    assert {attr(s.attributes, "rollout.step") for s in spans} == {12}
    assert sum(attr(s.attributes, "gen_ai.usage.output_tokens") for s in spans) == sum(
        len(c) for c in out["completion_ids"]
    )
