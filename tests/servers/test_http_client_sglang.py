"""slime's way of rolling out, zero-code: ``httpx.AsyncClient`` POSTs to a real SGLang server's
native ``/generate`` (and the ``openai`` client to its ``/v1/completions``) inside ``rollout_step``.

No header is set by the caller: the client hook adds the step's context, the server's request
spans land in the step's trace with ``rollout.step``, and the step counts every request with the
token counts and finish reasons SGLang returned in ``meta_info`` / ``usage``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.engines import long_tail_lengths
from testkit.otlp_receiver import OTLPReceiver, attr
from tests.conftest import OTelHarness, require_module
from tests.servers.checks import request_spans
from tests.servers.conftest import Server, sglang_server, stop_server

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def server(tiny_model: str, receiver: OTLPReceiver, server_log: Path) -> Iterator[Server]:
    require_module("sglang")
    srv = sglang_server(tiny_model, receiver, server_log)
    yield srv
    stop_server(srv)


async def _generate(client: Any, url: str, max_new_tokens: int, stream: bool) -> dict[str, Any]:
    """One sample as slime sends it (``/generate``), returning SGLang's final ``meta_info``."""
    payload = {
        "text": "Once upon a time",
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True},
        "stream": stream,
    }
    if not stream:
        response = await client.post(f"{url}/generate", json=payload)
        response.raise_for_status()
        return dict(response.json()["meta_info"])
    last: dict[str, Any] = {}
    async with client.stream("POST", f"{url}/generate", json=payload) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                last = json.loads(line[5:])
    return dict(last["meta_info"])


def test_native_generate_and_openai_requests_count_in_the_step(
    server: Server,
    receiver: OTLPReceiver,
    otel: OTelHarness,
    http_client_hook: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import httpx
    import openai

    from otel_rollout import rollout_step

    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv("OTEL_ROLLOUT_STEP_LOG", str(log))
    lengths = long_tail_lengths(6, seed=11, low=4, high=40)

    async def rollout() -> tuple[list[dict[str, Any]], str, int]:
        async with httpx.AsyncClient(timeout=120) as client, rollout_step(5):
            metas = await asyncio.gather(
                *(
                    _generate(client, server.url, n, stream=i % 2 == 1)
                    for i, n in enumerate(lengths)
                )
            )
            api = openai.AsyncOpenAI(
                base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120
            )
            out = await api.completions.create(
                model=server.model,
                prompt="Once upon a time",
                max_tokens=7,
                extra_body={"ignore_eos": True},
            )
            await api.close()
        assert out.usage is not None
        return list(metas), out.id, out.usage.completion_tokens

    metas, completion_id, completion_tokens = asyncio.run(rollout())
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["step"] == 5 and entry["stats"]["requests"] == len(metas) + 1
    requests = entry["requests"]
    assert {r["timing_source"] for r in requests} == {"client"}
    native = {r["request_id"]: r for r in requests if r["request_id"] != completion_id}
    assert sorted(native) == sorted(m["id"] for m in metas)
    for meta in metas:
        mine = native[meta["id"]]
        assert mine["output_tokens"] == meta["completion_tokens"]
        assert mine["prompt_tokens"] == meta["prompt_tokens"]
        assert mine["finish_reason"] == meta["finish_reason"]["type"] == "length"
    openai_record = [r for r in requests if r["request_id"] == completion_id]
    assert len(openai_record) == 1 and openai_record[0]["output_tokens"] == completion_tokens == 7

    trace_id = entry["trace_id"]
    step_span = [s for s in otel.finished_spans() if s.name == "rollout.step"][-1]
    assert format(step_span.context.trace_id, "032x") == trace_id
    assert step_span.attributes["rollout.step.requests"] == len(metas) + 1

    def served(r: OTLPReceiver) -> list[Any]:
        return [s for s in request_spans(r, "sglang") if s.trace_id.hex() == trace_id]

    assert receiver.wait_for(lambda r: len(served(r)) >= len(metas) + 1, timeout=30)
    time.sleep(1.0)  # > the server's 200 ms batch delay: a span too many would be here by now
    spans = served(receiver)
    assert len(spans) == len(metas) + 1
    assert {attr(s.attributes, "rollout.step") for s in spans} == {5}
    assert sorted(attr(s.attributes, "gen_ai.usage.output_tokens") for s in spans) == sorted(
        [m["completion_tokens"] for m in metas] + [completion_tokens]
    )
