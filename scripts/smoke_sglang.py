#!/usr/bin/env python3
"""Smoke test: the real SGLang engine runs the tiny local model on CPU.

    PY="$(scripts/engine-env sglang)/bin/python"
    MODEL="$(scripts/tiny-model)"
    $PY scripts/smoke_sglang.py --model "$MODEL"              # generate single/batch/stream + async
    $PY scripts/smoke_sglang.py --model "$MODEL" --metrics    # same, with enable_metrics=True

It sets SGLANG_USE_CPU_ENGINE=1 and puts testkit/sgl_kernel_standin (the test-environment
stand-in for the missing CPU build of sgl_kernel) on sys.path and PYTHONPATH, so that the
engine's child processes import it too. Exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testkit.engines import sglang_environment, sglang_kwargs  # noqa: E402

sglang_environment()


def say(msg: str) -> None:
    print(f"[smoke_sglang] {msg}", flush=True)


def default_model() -> str:
    root = os.environ.get("OTEL_ROLLOUT_CACHE") or os.path.expanduser("~/.cache/otel-rollout")
    return str(Path(root) / "models" / "tiny-llama-v1")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--metrics", action="store_true", help="Engine(enable_metrics=True)")
    args = ap.parse_args()

    import sgl_kernel
    import sglang

    assert getattr(sgl_kernel, "IS_TEST_STANDIN", False), f"real sgl_kernel? {sgl_kernel.__file__}"
    say(f"sglang {sglang.__version__} model={args.model} enable_metrics={args.metrics}")

    t0 = time.perf_counter()
    engine = sglang.Engine(model_path=args.model, **sglang_kwargs(enable_metrics=args.metrics))
    say(f"Engine up in {time.perf_counter() - t0:.2f}s")
    try:
        # single
        t0 = time.perf_counter()
        out = engine.generate(
            prompt="def hello():", sampling_params={"max_new_tokens": 8, "ignore_eos": True}
        )
        say(
            f"single generate in {time.perf_counter() - t0:.3f}s: type={type(out).__name__} "
            f"keys={sorted(out)}"
        )
        say(f"  meta_info={out['meta_info']}")
        assert isinstance(out, dict) and len(out["output_ids"]) == 8, out
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 8}, out[
            "meta_info"
        ]

        # batch
        t0 = time.perf_counter()
        outs = engine.generate(
            prompt=[f"import m{i}" for i in range(4)],
            sampling_params=[{"max_new_tokens": 4 + 4 * i, "ignore_eos": True} for i in range(4)],
        )
        say(
            f"batch generate in {time.perf_counter() - t0:.3f}s: type={type(outs).__name__} "
            f"lens={[len(o['output_ids']) for o in outs]} ids={[o['meta_info']['id'] for o in outs]}"
        )
        assert isinstance(outs, list) and [len(o["output_ids"]) for o in outs] == [4, 8, 12, 16]

        # stream (single)
        t0 = time.perf_counter()
        chunks = []
        for chunk in engine.generate(
            prompt="class A:",
            stream=True,
            sampling_params={"max_new_tokens": 6, "ignore_eos": True},
        ):
            chunks.append((len(chunk["output_ids"]), copy.deepcopy(chunk["meta_info"])))
        say(
            f"stream generate in {time.perf_counter() - t0:.3f}s: {len(chunks)} chunks, "
            f"output_ids lens={[n for n, _ in chunks]}"
        )
        say(f"  first chunk meta={chunks[0][1]}")
        say(f"  last chunk meta={chunks[-1][1]}")
        assert chunks[-1][1]["finish_reason"] is not None

        # stream (batch): chunks carry "index"
        seen = {}
        for chunk in engine.generate(
            prompt=["a = 1", "b = 2"],
            stream=True,
            sampling_params={"max_new_tokens": 3, "ignore_eos": True},
        ):
            seen.setdefault(chunk.get("index"), 0)
            seen[chunk.get("index")] += 1
        say(f"batch stream: chunks per index={seen}")
        assert set(seen) == {0, 1}, seen

        # async_generate on engine.loop (a fresh loop would hang)
        async def agen():
            return await asyncio.gather(
                *(
                    engine.async_generate(
                        prompt=f"x{i} =",
                        rid=f"smoke-{i}",
                        sampling_params={"max_new_tokens": 5, "ignore_eos": True},
                    )
                    for i in range(3)
                )
            )

        t0 = time.perf_counter()
        aouts = engine.loop.run_until_complete(agen())
        say(
            f"async_generate x3 in {time.perf_counter() - t0:.3f}s: "
            f"ids={[o['meta_info']['id'] for o in aouts]}"
        )
        assert [o["meta_info"]["id"] for o in aouts] == ["smoke-0", "smoke-1", "smoke-2"]

        async def astream():
            n = 0
            gen = await engine.async_generate(
                prompt="y =", stream=True, sampling_params={"max_new_tokens": 4, "ignore_eos": True}
            )
            async for _ in gen:
                n += 1
            return n

        say(f"async stream chunks={engine.loop.run_until_complete(astream())}")
    finally:
        engine.shutdown()
    say("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
