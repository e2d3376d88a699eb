"""What an engine server's HTTP bodies say, in the client's terms: pure functions, no I/O.

The client side of an engine request (:mod:`otel_rollout.http.adapter`) reads two bodies: the
request's (how many prompts it sent, ``n`` samples each) and the response's (per engine
request: id, model, token counts, finish reasons), in the OpenAI format (``usage``,
``choices``) or SGLang's native one (``meta_info``). Kept apart so they are tested without a
server, as the engines' extractors are.
"""

from __future__ import annotations

import json
from typing import Any

from otel_rollout.record import normalize_finish_reason

__all__ = ["batch_shape", "native_finished", "records_of", "request_body"]


def native_finished(body: Any) -> bool:
    items = body if isinstance(body, list) else [body]
    return all(
        isinstance(i, dict) and (i.get("meta_info") or {}).get("finish_reason") for i in items
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def request_body(request: Any) -> Any:
    """The JSON body a request sends (httpx's ``content``, requests' ``body``); ``None`` when it
    is not at hand (a streamed upload) or not JSON."""
    try:
        raw = getattr(request, "content", None)
    except Exception:  # httpx: a streamed request body that was not read
        raw = None
    if raw is None:
        raw = getattr(request, "body", None)
    if not isinstance(raw, (bytes, str)) or not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def batch_shape(body: Any) -> tuple[int, int]:
    """(prompts, n) of an OpenAI completions request: ``prompt`` may be a list of prompts (texts,
    or token-id lists), each an engine request of ``n`` samples. One prompt where it is a single
    text or a single token-id list."""
    if not isinstance(body, dict):
        return 1, 1
    prompt = body.get("prompt")
    n = _int(body.get("n")) or 1
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return len(prompt), max(1, n)
    return 1, max(1, n)


def records_of(body: Any, native: bool, prompts: int = 1, n: int = 1) -> list[dict[str, Any]]:
    """The fields of each engine request a response body reports, in the client's terms: one
    per prompt of a batched completions request (its ``n`` choices, ``index`` = prompt × n + j;
    token counts from the choices' ``token_ids`` where the server returned them, the body's
    ``usage`` being the batch's sum)."""
    if not native and prompts > 1 and isinstance(body, dict):
        return _split_by_prompt(body, prompts, n)
    if native:  # SGLang /generate: one dict, or a list of them for a batch
        items = body if isinstance(body, list) else [body]
        out = []
        for item in items:
            meta = item.get("meta_info") if isinstance(item, dict) else None
            meta = meta if isinstance(meta, dict) else {}
            reason = normalize_finish_reason(meta.get("finish_reason"))
            out.append(
                {
                    "id": meta.get("id"),
                    "prompt_tokens": _int(meta.get("prompt_tokens")),
                    "output_tokens": _int(meta.get("completion_tokens")),
                    "cached_tokens": _int(meta.get("cached_tokens")),
                    "finish_reasons": (reason,) if reason else (),
                }
            )
        return out
    if not isinstance(body, dict):
        return [{}]
    raw_usage = body.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    choices = [c for c in body.get("choices") or () if isinstance(c, dict)]
    choices.sort(key=lambda c: c.get("index", 0) if isinstance(c.get("index"), int) else 0)
    reasons = tuple(
        r for c in choices if (r := normalize_finish_reason(c.get("finish_reason"))) is not None
    )
    details = usage.get("prompt_tokens_details")
    return [
        {
            "id": body.get("id"),
            "model": body.get("model"),
            "prompt_tokens": _int(usage.get("prompt_tokens")),
            "output_tokens": _int(usage.get("completion_tokens")),
            "cached_tokens": _int(details.get("cached_tokens"))
            if isinstance(details, dict)
            else None,
            "finish_reasons": reasons,
            "n": len(choices) if len(choices) > 1 else None,
        }
    ]


def _split_by_prompt(body: dict[str, Any], prompts: int, n: int) -> list[dict[str, Any]]:
    choices: dict[int, list[dict[str, Any]]] = {i: [] for i in range(prompts)}
    for choice in body.get("choices") or ():
        index = choice.get("index") if isinstance(choice, dict) else None
        if isinstance(index, int) and 0 <= index // n < prompts:
            choices[index // n].append(choice)
    out = []
    for index in range(prompts):
        mine = sorted(choices[index], key=lambda c: c["index"])
        ids = [t for c in mine if isinstance(t := c.get("token_ids"), list)]
        tokens = sum(map(len, ids)) if mine and len(ids) == len(mine) else None
        prompt_ids = mine[0].get("prompt_token_ids") if mine else None
        reasons = tuple(
            r for c in mine if (r := normalize_finish_reason(c.get("finish_reason"))) is not None
        )
        out.append(
            {
                "id": body.get("id"),
                "model": body.get("model"),
                "prompt_tokens": len(prompt_ids) if isinstance(prompt_ids, list) else None,
                "output_tokens": tokens,
                "finish_reasons": reasons,
                "n": n if n > 1 else None,
            }
        )
    return out
