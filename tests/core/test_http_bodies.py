"""Engine servers' HTTP bodies in the client's terms (:mod:`otel_rollout.http.bodies`), without a
server: the real bodies are checked end to end in tests/servers and tests/trl."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from otel_rollout.http.bodies import batch_shape, records_of, request_body


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        ({"prompt": "one text", "n": 3}, (1, 3)),
        ({"prompt": [1, 2, 3]}, (1, 1)),  # one prompt as token ids
        ({"prompt": ["a", "b", "c"], "n": 4}, (3, 4)),
        ({"prompt": [[1, 2], [3]]}, (2, 1)),  # prompts as token-id lists (TRL's)
        ({"prompt": ["a", "b"], "n": True}, (2, 1)),  # not a count
        ({"messages": []}, (1, 1)),
        (None, (1, 1)),
    ],
)
def test_batch_shape(body: object, shape: tuple[int, int]) -> None:
    assert batch_shape(body) == shape


def test_request_bodies_of_both_clients() -> None:
    sent = {"prompt": ["a", "b"], "n": 2}
    assert request_body(SimpleNamespace(content=json.dumps(sent).encode())) == sent  # httpx
    assert request_body(SimpleNamespace(body=json.dumps(sent))) == sent  # requests
    assert request_body(SimpleNamespace(body=b"not json")) is None
    assert request_body(SimpleNamespace(body=None)) is None


def _choice(index: int, tokens: int, reason: str = "length") -> dict[str, object]:
    return {
        "index": index,
        "token_ids": list(range(tokens)),
        "prompt_token_ids": [7, 8, 9],
        "finish_reason": reason,
    }


def test_a_batch_of_prompts_is_one_record_per_prompt() -> None:
    body = {
        "id": "cmpl-1",
        "model": "m",
        "usage": {"prompt_tokens": 9, "completion_tokens": 21},
        # out of order, as a server may list them: index = prompt × n + j
        "choices": [_choice(3, 4, "stop"), _choice(0, 5), _choice(5, 2), _choice(1, 5)]
        + [_choice(2, 3), _choice(4, 2)],
    }
    records = records_of(body, False, prompts=3, n=2)
    assert [r["output_tokens"] for r in records] == [10, 7, 4]
    assert [r["finish_reasons"] for r in records] == [
        ("length", "length"),
        ("length", "stop"),
        ("length", "length"),
    ]
    assert {r["n"] for r in records} == {2} and {r["prompt_tokens"] for r in records} == {3}
    # the body's usage is the batch's: the choices' own token lists are what is split
    assert sum(r["output_tokens"] for r in records) == body["usage"]["completion_tokens"]


def test_a_batch_without_token_ids_counts_its_requests_not_their_tokens() -> None:
    body = {"choices": [{"index": i, "finish_reason": "stop"} for i in range(4)]}
    records = records_of(body, False, prompts=4, n=1)
    assert len(records) == 4 and {r["output_tokens"] for r in records} == {None}
    assert {r["n"] for r in records} == {None}


def test_one_prompt_keeps_the_bodys_usage() -> None:
    body = {
        "id": "cmpl-2",
        "usage": {"prompt_tokens": 3, "completion_tokens": 8},
        "choices": [_choice(0, 4), _choice(1, 4, "stop")],
    }
    (record,) = records_of(body, False)
    assert (record["output_tokens"], record["n"]) == (8, 2)
    assert record["finish_reasons"] == ("length", "stop")
