"""HTTP rollout clients, zero-code: the real ``openai`` client inside ``rollout_step`` sends to a
real vLLM OpenAI server (under ``opentelemetry-instrument``) with no header of its own.

The client's httpx hook adds the step's context, so the server's request spans land in the
step's trace with ``rollout.step``; and the responses come back to the step, so its analytics
count every request with the token counts the client received (``rollout.timing.source`` of
those records: ``client``). The server's spans are checked on the wire (OTLP receiver); the
step's side in this process (in-memory SDK, step log).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from testkit.engines import long_tail_lengths
from testkit.otlp_receiver import OTLPReceiver, attr
from tests.conftest import OTelHarness, require_module
from tests.servers.checks import request_spans
from tests.servers.conftest import Server, stop_server, vllm_server

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def server(tiny_model: str, receiver: OTLPReceiver, server_log: Path) -> Iterator[Server]:
    require_module("vllm")
    srv = vllm_server(tiny_model, receiver, server_log)
    yield srv
    stop_server(srv)


def _entries(path: Path) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in map(json.loads, path.read_text().splitlines())}


def _body(kind: str, model: str, max_tokens: int) -> dict[str, Any]:
    common: dict[str, Any] = dict(
        model=model, max_tokens=max_tokens, temperature=1.0, extra_body={"ignore_eos": True}
    )
    if kind.endswith("stream"):
        common.update(stream=True, stream_options={"include_usage": True})
    if kind.startswith("chat"):
        common["messages"] = [{"role": "user", "content": "Tell me a story."}]
    else:
        common["prompt"] = "Once upon a time"
    return common


KINDS = ("completion", "chat", "completion_stream", "chat_stream")


Call = tuple[str, int, str, bool]
"""(response id, completion tokens the client was told, finish reason, streamed)."""


class _Streamed:
    """What the client read from a stream: its id, the usage chunk, the last finish reason."""

    def __init__(self) -> None:
        self.rid, self.usage, self.reason = "", None, None

    def add(self, chunk: Any) -> None:
        self.rid = self.rid or chunk.id
        self.usage = chunk.usage or self.usage
        for choice in chunk.choices:
            self.reason = choice.finish_reason or self.reason

    def call(self) -> Call:
        assert self.usage is not None, "the stream had no usage chunk"
        return self.rid, self.usage.completion_tokens, self.reason, True


def _sync_call(api: Any, kind: str, body: dict[str, Any]) -> Call:
    create = api.chat.completions.create if kind.startswith("chat") else api.completions.create
    out = create(**body)
    if not kind.endswith("stream"):
        return out.id, out.usage.completion_tokens, out.choices[0].finish_reason, False
    stream = _Streamed()
    for chunk in out:
        stream.add(chunk)
    return stream.call()


async def _async_call(api: Any, kind: str, body: dict[str, Any]) -> Call:
    create = api.chat.completions.create if kind.startswith("chat") else api.completions.create
    out = await create(**body)
    if not kind.endswith("stream"):
        return out.id, out.usage.completion_tokens, out.choices[0].finish_reason, False
    stream = _Streamed()
    async for chunk in out:
        stream.add(chunk)
    return stream.call()


def _check_step(
    entry: dict[str, Any],
    calls: list[Call],
    receiver: OTLPReceiver,
    otel: OTelHarness,
    step: int,
    server_url: str,
    aborted: int = 0,
) -> None:
    """The step counted exactly its calls (and ``aborted`` streams closed early), with the
    client's token counts, in one trace that holds exactly one server request span per call
    (each with the step's number)."""
    assert entry["stats"]["requests"] == len(calls) + aborted
    requests = [r for r in entry["requests"] if r["finish_reason"] != "abort"]
    assert len(entry["requests"]) - len(requests) == aborted
    assert sorted(r["request_id"] for r in requests) == sorted(c[0] for c in calls)
    assert sorted(r["output_tokens"] for r in requests) == sorted(c[1] for c in calls)
    assert sorted(r["finish_reason"] for r in requests) == sorted(c[2] for c in calls)
    assert {r["timing_source"] for r in requests} == {"client"}
    # the replica as the client knows it: the server's host:port
    assert {r["replica"] for r in entry["requests"]} == {urlsplit(server_url).netloc}
    # Streams have a first token (their first event); whole responses do not say.
    streamed = {c[0] for c in calls if c[3]}
    assert {r["request_id"] for r in requests if r["first_token_ns"] is not None} == streamed
    trace_id = entry["trace_id"]
    assert trace_id is not None
    step_spans = [s for s in otel.finished_spans() if s.name == "rollout.step"]
    mine = [s for s in step_spans if s.attributes.get("rollout.step") == step]
    assert len(mine) == 1 and format(mine[0].context.trace_id, "032x") == trace_id
    assert mine[0].attributes["rollout.step.requests"] == len(calls) + aborted

    def served(r: OTLPReceiver) -> list[Any]:
        return [s for s in request_spans(r, "vllm") if s.trace_id.hex() == trace_id]

    assert receiver.wait_for(lambda r: len(served(r)) >= len(calls) + aborted, timeout=30)
    time.sleep(1.0)  # > the server's 200 ms batch delay: a span too many would be here by now
    every = served(receiver)
    assert len(every) == len(calls) + aborted
    assert {attr(s.attributes, "rollout.step") for s in every} == {step}
    ids = {c[0] for c in calls}
    spans = [
        s
        for s in every
        if any(str(attr(s.attributes, "gen_ai.response.id") or "").startswith(i) for i in ids)
    ]
    assert len(spans) == len(calls)
    assert sorted(attr(s.attributes, "gen_ai.usage.output_tokens") for s in spans) == sorted(
        c[1] for c in calls
    )


def test_sync_client_steps_count_every_request_zero_code(
    server: Server,
    receiver: OTLPReceiver,
    otel: OTelHarness,
    http_client_hook: None,
    step_log: Path,
) -> None:
    import openai

    from otel_rollout import rollout_step

    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    lengths = long_tail_lengths(8, seed=5, low=4, high=48)
    calls: dict[int, list[Call]] = {}
    for step in (1, 2):
        with rollout_step(step):
            calls[step] = [
                _sync_call(api, KINDS[i % 4], _body(KINDS[i % 4], server.model, n))
                for i, n in enumerate(lengths[(step - 1) * 4 : step * 4])
            ]
    # Outside a step nothing is added: the server's span is a root, no step counts it.
    plain = _sync_call(api, "completion", _body("completion", server.model, 3))
    entries = _entries(step_log)
    assert sorted(entries) == [1, 2]
    for step in (1, 2):
        _check_step(entries[step], calls[step], receiver, otel, step, server.url)
    assert receiver.wait_for(
        lambda r: any(
            str(attr(s.attributes, "gen_ai.response.id") or "").startswith(plain[0])
            for s in request_spans(r, "vllm")
        ),
        timeout=30,
    )
    root = [
        s
        for s in request_spans(receiver, "vllm")
        if str(attr(s.attributes, "gen_ai.response.id") or "").startswith(plain[0])
    ]
    assert len(root) == 1 and attr(root[0].attributes, "rollout.step") is None


def test_async_client_gathered_requests_and_a_stream_closed_early(
    server: Server,
    receiver: OTLPReceiver,
    otel: OTelHarness,
    http_client_hook: None,
    step_log: Path,
) -> None:
    import openai

    from otel_rollout import rollout_step

    async def rollout() -> tuple[list[Call], int]:
        api = openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120
        )
        lengths = long_tail_lengths(6, seed=9, low=4, high=64)
        async with rollout_step(3) as scope:
            done = await asyncio.gather(
                *(
                    _async_call(api, KINDS[i % 4], _body(KINDS[i % 4], server.model, n))
                    for i, n in enumerate(lengths)
                )
            )
            # A consumer that stops reading: counted, as an abort, not lost.
            stream = await api.completions.create(**_body("completion_stream", server.model, 200))
            async for _chunk in stream:
                break
            await stream.close()
        await api.close()
        assert scope.stats is not None
        return list(done), scope.stats.requests

    done, counted = asyncio.run(rollout())
    assert counted == len(done) + 1
    _check_step(_entries(step_log)[3], done, receiver, otel, 3, server.url, aborted=1)


def test_requests_batch_of_prompts_counts_one_request_per_prompt(
    server: Server,
    receiver: OTLPReceiver,
    otel: OTelHarness,
    http_client_hook: None,
    step_log: Path,
) -> None:
    """TRL's server mode (``VLLMClient.generate``): the real ``requests`` library, one POST of a
    batch of prompts with ``n`` samples each and ``return_token_ids``. vLLM's server makes one
    engine request per prompt; the step counts one record per prompt, with the tokens its
    choices returned, and the server's spans are in the step's trace."""
    import requests

    from otel_rollout import rollout_step

    prompts, n, max_tokens = ["Once upon a time", "The sky is", "In a village"], 2, 5
    session = requests.Session()
    with rollout_step(31):
        response = session.post(
            f"{server.url}/v1/completions",
            json={
                "model": server.model,
                "prompt": prompts,
                "n": n,
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "return_token_ids": True,
            },
            timeout=120,
        )
    body = response.json()
    assert response.status_code == 200 and len(body["choices"]) == len(prompts) * n
    entry = _entries(step_log)[31]
    assert entry["stats"]["requests"] == len(prompts)
    records = entry["requests"]
    assert [r["output_tokens"] for r in records] == [n * max_tokens] * len(prompts)
    assert {r["timing_source"] for r in records} == {"client"}
    assert {r["finish_reason"] for r in records} == {"length"}
    trace_id = entry["trace_id"]

    def served(r: OTLPReceiver) -> list[Any]:
        return [s for s in request_spans(r, "vllm") if s.trace_id.hex() == trace_id]

    assert receiver.wait_for(lambda r: len(served(r)) >= len(prompts), timeout=30)
    time.sleep(1.0)  # > the server's 200 ms batch delay: a span too many would be here by now
    spans = served(receiver)
    assert len(spans) == len(prompts)
    assert {attr(s.attributes, "rollout.step") for s in spans} == {31}
    assert sum(attr(s.attributes, "gen_ai.usage.output_tokens") for s in spans) == sum(
        r["output_tokens"] for r in records
    )
    # outside a step requests is left alone: no context header added, nothing counted
    plain = session.post(
        f"{server.url}/v1/completions",
        json={"model": server.model, "prompt": "Hello", "max_tokens": 2},
        timeout=120,
    )
    assert plain.status_code == 200 and "traceparent" not in plain.request.headers
