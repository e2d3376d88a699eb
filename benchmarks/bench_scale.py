"""Figure 3: what one huge ``LLM.generate`` costs its caller after the engine returned.

No engine runs: the real offline wrapper (applied with wrapt) wraps a stand-in ``generate`` that
returns N real ``vllm.outputs.RequestOutput`` objects with engine stats (the shape with the most
per-request work: first-token event, TTFT, TPOT and queue time). Per round, in rotating order:

* G — instrumented, background emitter (the default): the caller's wall time, then (untimed for
  the caller) the wait until the emitter has made every span and point;
* I — instrumented, ``OTEL_ROLLOUT_EMIT_QUEUE=0`` (inline, the previous behaviour);
* B — the bare stand-in;
* F — the SDK floor: the same spans and histogram records, SDK only.

caller-visible = wall(G) − wall(B): record building, id drawing and the hand-off, i.e. what the
trainer waits for after the engine returned. total CPU = process CPU of G including the emitter
thread until it is done − B (the work moved off the caller, not removed). inline = wall(I) − wall(B).
N = 1k, 10k, 100k: per-request time should stay flat (linear). The real-engine counterpart
(10,000 prompts through ``LLM.generate``) is in bench_engine.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time
from typing import Any

import _common as C
from bench_cost import floor_for, records_for


def _one_size(n: int, reps: int, background: Any, inline: Any) -> dict[str, Any]:
    import wrapt
    from opentelemetry import trace

    from otel_rollout.emitter import flush_all
    from otel_rollout.vllm import adapter

    lengths = C.long_tail(n, seed=n)
    outputs = C.make_outputs(lengths, stats=True)
    params = C.make_params(lengths)
    prompts = [f"p{i}" for i in range(n)]

    class Bare:
        llm_engine = C._Engine(log_stats=True)

        def generate(
            self, prompts: Any, sampling_params: Any = None, *, use_tqdm: bool = True
        ) -> Any:
            return outputs

    class Background(Bare):
        pass

    class Inline(Bare):
        pass

    wrapt.wrap_function_wrapper(
        Background, "generate", adapter.offline_wrapper(background, "text_completion")
    )
    wrapt.wrap_function_wrapper(
        Inline, "generate", adapter.offline_wrapper(inline, "text_completion")
    )
    recs = records_for(outputs, params, "tiny-llama-v1", "text_completion", True)
    ctx = trace.set_span_in_context(inline.tracer.start_span("rollout.batch"))
    floor = floor_for(inline, recs, lambda: ctx)
    del recs
    calls = {
        "G": lambda: Background().generate(prompts, params, use_tqdm=False),
        "I": lambda: Inline().generate(prompts, params, use_tqdm=False),
        "B": lambda: Bare().generate(prompts, params, use_tqdm=False),
        "F": floor,
    }
    if n <= 10000:
        for fn in calls.values():
            fn()
        flush_all(600)
    series: dict[str, list[float]] = {
        k: [] for k in ("caller", "caller_cpu", "drain", "total_cpu", "inline", "floor")
    }
    gc.collect()
    for r in range(reps):
        wall: dict[str, float] = {}
        cpu: dict[str, float] = {}
        for key in ("GIBF", "FBIG", "BGFI", "IFGB")[r % 4]:
            p0, c0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
            calls[key]()
            wall[key], cpu[key] = time.perf_counter() - w0, time.thread_time() - c0
            if key == "G":
                assert flush_all(600), "the emitter did not catch up"
                series["drain"].append((time.perf_counter() - w0) * 1e3)
                series["total_cpu"].append((time.process_time() - p0) * 1e3)
            gc.collect()
        series["caller"].append((wall["G"] - wall["B"]) * 1e3)
        series["caller_cpu"].append((cpu["G"] - cpu["B"]) * 1e3)
        series["total_cpu"][-1] -= cpu["B"] * 1e3
        series["inline"].append((wall["I"] - wall["B"]) * 1e3)
        series["floor"].append(wall["F"] * 1e3)
    per = {k: round(statistics.median(v) * 1e3 / n, 2) for k, v in series.items()}
    res = {
        "requests": n,
        "caller_visible_ms": C.band(series["caller"], 1),
        "caller_cpu_ms": C.band(series["caller_cpu"], 1),
        "emitter_done_after_ms": C.band(series["drain"], 1),
        "total_cpu_ms": C.band(series["total_cpu"], 1),
        "inline_ms": C.band(series["inline"], 1),
        "floor_ms": C.band(series["floor"], 1),
        "us_per_request": per,
    }
    return res


def run(smoke: bool) -> dict[str, Any]:
    from otel_rollout.config import load_config
    from otel_rollout.telemetry import create_telemetry

    C.setup_sdk("simple")
    config = load_config()
    background = create_telemetry("vllm", config=config)
    inline = create_telemetry("vllm", config=dataclasses.replace(config, emit_queue=0))
    sizes = [(100, 2), (300, 2)] if smoke else [(1000, 9), (10000, 5), (100000, 2)]
    results: dict[str, Any] = {"machine": C.machine(), "emit_queue": config.emit_queue, "sizes": {}}
    for n, reps in sizes:
        res = _one_size(n, reps, background, inline)
        results["sizes"][str(n)] = res
        print(n, res, flush=True)
        gc.collect()
    per_req = [v["us_per_request"]["caller_cpu"] for v in results["sizes"].values()]
    results["growth_per_request_last_over_first"] = round(per_req[-1] / per_req[0], 2)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    C.write(args.out, run(args.smoke))


if __name__ == "__main__":
    main()
