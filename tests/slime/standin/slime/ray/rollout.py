"""TEST STAND-IN for slime 0.3.1's ``slime/ray/rollout.py`` (slime is not on PyPI).

What our hook relies on is kept as slime has it, and held to slime's released source by
tests/slime/test_slime_contract.py: the module path, ``RolloutManager`` decorated ``@ray.remote``
where it is defined (so Ray ships the class by value and the module's name is Ray's
``ActorClass``), a synchronous actor, ``generate(self, rollout_id)`` and
``eval(self, rollout_id)``.

The bodies do on the wire what slime's default rollout function
(``slime.rollout.sglang_rollout.generate_rollout``) does: the coroutine runs on slime's
background event-loop thread (``slime.utils.async_utils.run``: ``run_coroutine_threadsafe``),
and each sample is one ``httpx.AsyncClient`` POST of token ids to sglang-router's ``/generate``
with ``return_logprob`` (``slime.utils.http_utils.post``). Tokenising, rewards and the
conversion to training data are left out: they make no engine request.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import ray


class _AsyncLoopThread:
    """slime.utils.async_utils.AsyncLoopThread: one background loop the rollout runs on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._start_loop, daemon=True)
        self._thread.start()

    def _start_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_client: httpx.AsyncClient | None = None


async def _post(url: str, payload: dict[str, Any]) -> dict[str, Any]:
    """slime.utils.http_utils.post: one client for the process (``init_http_client``)."""
    global _client
    if _client is None:
        _client = httpx.AsyncClient(timeout=httpx.Timeout(None))
    response = await _client.post(url, json=payload)
    response.raise_for_status()
    return dict(response.json())


async def _generate_rollout_async(
    router_url: str, prompts: list[list[int]], lengths: list[int]
) -> list[dict[str, Any]]:
    """slime.rollout.sglang_rollout.generate: every sample at once, token ids in, logprobs out."""
    payloads = [
        {
            "input_ids": prompts[i % len(prompts)],
            "sampling_params": {"max_new_tokens": n, "temperature": 1.0, "ignore_eos": True},
            "return_logprob": True,
        }
        for i, n in enumerate(lengths)
    ]
    outputs = await asyncio.gather(*(_post(f"{router_url}/generate", p) for p in payloads))
    return [dict(o["meta_info"]) for o in outputs]


@ray.remote
class RolloutManager:
    """The class to run rollout and convert rollout data to training data (stand-in). A
    synchronous actor, as slime's is: the rollout's coroutines run on the background loop."""

    def __init__(self, router_url: str, prompts: list[list[int]], max_new_tokens: list[int]):
        self.router_url = router_url
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.rollout_id = -1
        self._loop = _AsyncLoopThread()

    def _rollout(self, lengths: list[int]) -> list[dict[str, Any]]:
        coro = _generate_rollout_async(self.router_url, self.prompts, lengths)
        return list(self._loop.run(coro))

    def generate(self, rollout_id):  # slime's own (untyped) signature
        self.rollout_id = rollout_id
        return {"rollout_id": rollout_id, "samples": self._rollout(self.max_new_tokens)}

    def eval(self, rollout_id):  # slime's own (untyped) signature
        return {"rollout_id": rollout_id, "samples": self._rollout(self.max_new_tokens[:2])}
