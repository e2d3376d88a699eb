"""verl's agent-loop layout, without a line of OpenTelemetry: workers fan out to a server actor.

``ServerActor`` holds a real vLLM ``AsyncLLM`` (as verl's ``vLLMHttpServer`` does);
``WorkerActor`` (as ``AgentLoopWorker``) sends each sample to it with ``.remote()`` and gathers.
Kept in a module of its own so Ray workers import the classes by name.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any


class ServerActor:
    def __init__(self, model: str, engine_kwargs: dict[str, Any]) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(model=model, disable_log_stats=True, **engine_kwargs)
        self.engine = AsyncLLM.from_engine_args(args)

    async def generate(self, prompt: str, max_tokens: int, natural: bool = False) -> dict[str, Any]:
        """Exactly ``max_tokens`` (stopping there: ``length``), or ``natural``: at least that
        many, then a stop as an EOS would (``stop``: testkit.engines.stop_after)."""
        from vllm import SamplingParams

        from testkit.engines import stop_after

        if natural:
            params = stop_after(SamplingParams, max_tokens)
        else:
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        final = None
        async for output in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex):
            final = output
        assert final is not None
        return {
            "request_id": final.request_id,
            "tokens": len(final.outputs[0].token_ids),
            "pid": os.getpid(),
        }

    def pid(self) -> int:
        return os.getpid()


class WorkerActor:
    def __init__(self, server: Any) -> None:
        self.server = server

    async def run(
        self, tag: str, lengths: list[int], natural: bool = False
    ) -> list[dict[str, Any]]:
        refs = [
            self.server.generate.remote(f"{tag} sample {i}", n, natural)
            for i, n in enumerate(lengths)
        ]
        return list(await asyncio.gather(*refs))

    def pid(self) -> int:
        return os.getpid()


def run_samples(server: Any, tag: str, lengths: list[int]) -> list[dict[str, Any]]:
    """``WorkerActor.run`` as a Ray *task* (a plain function): frameworks fan out with both."""
    import ray

    refs = [server.generate.remote(f"{tag} sample {i}", n) for i, n in enumerate(lengths)]
    return list(ray.get(refs))
