"""Figure 2 (and the real-engine part of figure 3): real vLLM on CPU, instrumented vs not.

One process, one engine; the instrumentor is applied and removed between runs
(``VLLMInstrumentor().instrument()`` / ``.uninstrument()``), pairs alternate their order
(AB, BA, AB, …) so drift in the machine's load falls on both sides. Every run does the same
work: the same prompts, the same long-tail ``max_tokens`` with ``ignore_eos`` and fixed seeds.
Telemetry goes through the real SDK: BatchSpanProcessor with a null exporter (its background
thread runs in this process, as in production) and an in-memory metric reader.

* ``--mode offline``: ``LLM.generate`` of a long-tail batch (engine stats off: vLLM's default).
  Full runs add ``LLM.generate`` of 10,000 prompts (``max_tokens=2``), three times per side in
  alternating order, timing the post-return phase from ``_run_engine`` returning to
  ``generate`` returning (median and band).
* ``--mode async``: ``AsyncLLM`` (engine core in a child process), all requests streamed
  concurrently (``asyncio.gather``), each consumed to the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import time
from typing import Any

import _common as C


def model_path() -> str:
    path = os.environ.get("MODEL")
    if path:
        return path
    out = subprocess.run(
        [str(C.REPO / "scripts" / "tiny-model")], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def engine_env() -> None:
    from testkit.engines import vllm_environment

    vllm_environment()
    os.environ.setdefault("VLLM_CACHE_ROOT", "/tmp/vcache")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def pairs_summary(a: list[float], b: list[float]) -> dict[str, Any]:
    ratios = [x / y for x, y in zip(a, b, strict=False)]
    return {
        "instrumented_s": C.band(a, 3),
        "bare_s": C.band(b, 3),
        "ratio": C.band(ratios, 4),
        "ratio_of_medians": round(statistics.median(a) / statistics.median(b), 4),
    }


def offline(smoke: bool) -> dict[str, Any]:
    engine_env()
    C.setup_sdk("batch")
    from vllm import LLM, SamplingParams
    from vllm.entrypoints.common import offline as offline_mod  # noqa: F401  (the mixin's module)

    from otel_rollout import VLLMInstrumentor
    from testkit.engines import VLLM_KWARGS

    llm = LLM(model=model_path(), **VLLM_KWARGS)
    inst = VLLMInstrumentor()
    n, pairs = (16, 1) if smoke else (256, 7)
    lengths = C.long_tail(n, seed=7, high=32 if smoke else 256)
    params = C.make_params(lengths)
    prompts = [f"def task_{i}(x):" for i in range(n)]

    def once(instrumented: bool) -> float:
        if instrumented:
            inst.instrument()
        try:
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            dt = time.perf_counter() - t0
        finally:
            if instrumented:
                inst.uninstrument()
        assert [len(o.outputs[0].token_ids) for o in outs] == lengths
        return dt

    once(True)
    once(False)
    a, b = [], []
    for p in range(pairs):
        for side in "AB" if p % 2 == 0 else "BA":
            (a if side == "A" else b).append(once(side == "A"))
    result: dict[str, Any] = {
        "requests": n,
        "tokens": sum(lengths),
        "pairs": pairs,
        **pairs_summary(a, b),
    }
    print("offline", result, flush=True)

    if not smoke:
        result["generate_10k"] = big_batch(llm, inst, SamplingParams)
        print("generate_10k", result["generate_10k"], flush=True)
    return result


def big_batch(llm: Any, inst: Any, sampling_params: Any, reps: int = 3) -> dict[str, Any]:
    """One LLM.generate of 10,000 prompts, ``reps`` times per side in alternating order (BA, AB,
    BA): the post-return phase, instrumented and bare, median and band. One wall-clock sample
    of ~150 ms on a shared 2-core machine moved by ±50 % between runs (a full collection of the
    engine's heap alone is ~50 ms when it falls there)."""
    from otel_rollout.emitter import flush_all

    cls = type(llm)
    original = cls._run_engine
    returned: list[float] = []

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        returned.append(time.perf_counter())
        return out

    cls._run_engine = timed
    n = 10_000
    prompts = [f"q{i}" for i in range(n)]
    params = sampling_params(max_tokens=2, ignore_eos=True)
    series: dict[str, dict[str, list[float]]] = {
        side: {"generate_s": [], "post_return_ms": [], "emitter_done_after_ms": []}
        for side in ("bare", "instrumented")
    }
    try:
        for rep in range(reps):
            for side in ("bare", "instrumented") if rep % 2 == 0 else ("instrumented", "bare"):
                if side == "instrumented":
                    inst.instrument()
                t0 = time.perf_counter()
                outs = llm.generate(prompts, params, use_tqdm=False)
                t1 = time.perf_counter()
                flush_all(600)  # not the caller's time: when the background emitter is done
                t2 = time.perf_counter()
                if side == "instrumented":
                    inst.uninstrument()
                assert len(outs) == n
                del outs
                got = series[side]
                got["generate_s"].append(t1 - t0)
                got["post_return_ms"].append((t1 - returned[-1]) * 1e3)
                got["emitter_done_after_ms"].append((t2 - returned[-1]) * 1e3)
    finally:
        cls._run_engine = original
    res: dict[str, Any] = {"requests": n, "reps": reps}
    for side, got in series.items():
        res[side] = {
            "generate_s": round(statistics.median(got["generate_s"]), 3),
            "post_return_ms": round(statistics.median(got["post_return_ms"]), 1),
            "post_return_band_ms": C.band(got["post_return_ms"], 1),
            "emitter_done_after_ms": round(statistics.median(got["emitter_done_after_ms"]), 1),
        }
    res["post_return_added_ms"] = round(
        res["instrumented"]["post_return_ms"] - res["bare"]["post_return_ms"], 1
    )
    return res


def async_mode(smoke: bool) -> dict[str, Any]:
    engine_env()
    C.setup_sdk("batch")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from otel_rollout import VLLMInstrumentor
    from testkit.engines import VLLM_KWARGS

    inst = VLLMInstrumentor()
    n, pairs = (16, 1) if smoke else (256, 5)
    lengths = C.long_tail(n, seed=11, high=32 if smoke else 256)
    params = C.make_params(lengths)
    run_no = 0

    async def main() -> dict[str, Any]:
        nonlocal run_no
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model_path(), **VLLM_KWARGS))

        async def stream(i: int, tag: str) -> int:
            tokens = 0
            async for out in engine.generate(f"def task_{i}(x):", params[i], f"{tag}-{i}"):
                tokens = len(out.outputs[0].token_ids)
            return tokens

        async def once(instrumented: bool) -> float:
            nonlocal run_no
            run_no += 1
            if instrumented:
                inst.instrument()
            try:
                t0 = time.perf_counter()
                got = await asyncio.gather(*(stream(i, f"run{run_no}") for i in range(n)))
                dt = time.perf_counter() - t0
            finally:
                if instrumented:
                    inst.uninstrument()
            assert got == lengths, "every stream must produce its requested length"
            return dt

        try:
            await once(True)
            await once(False)
            a, b = [], []
            for p in range(pairs):
                for side in "AB" if p % 2 == 0 else "BA":
                    (a if side == "A" else b).append(await once(side == "A"))
        finally:
            engine.shutdown()
        return {"requests": n, "tokens": sum(lengths), "pairs": pairs, **pairs_summary(a, b)}

    result = asyncio.run(main())
    print("async", result, flush=True)
    return result


def run(smoke: bool, mode: str = "offline") -> dict[str, Any]:
    result: dict[str, Any] = {"machine": C.machine()}
    if mode in ("offline", "all"):
        result["offline"] = offline(smoke)
    if mode in ("async", "all"):
        result["async"] = async_mode(smoke)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--mode", choices=("offline", "async", "all"), default="all")
    ap.add_argument("--out")
    args = ap.parse_args()
    C.write(args.out, run(args.smoke, args.mode))


if __name__ == "__main__":
    main()
