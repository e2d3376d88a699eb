"""Figure 3: the post-return phase of one huge ``LLM.generate`` — N child spans and metric points.

No engine runs: the real offline wrapper (applied with wrapt) wraps a stand-in ``generate`` that
returns N real ``vllm.outputs.RequestOutput`` objects with engine stats (the shape with the most
per-request work: first-token event, TTFT, TPOT and queue time). ours = wall time of the
instrumented call − the bare call, i.e. the record building + ``emit_all`` + the batch span that
happen after the engine returns. The floor (same spans and histogram records, SDK only) runs for
the same N in the same round. N = 1k, 10k, 100k: per-request time should stay flat (linear).

The real-engine counterpart (10,000 prompts through ``LLM.generate``) is in bench_engine.py.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

import _common as C
from bench_cost import floor_for, records_for


def run(smoke: bool) -> dict[str, Any]:
    import wrapt
    from opentelemetry import trace

    from otel_rollout.instrumentation import build_telemetry
    from otel_rollout.vllm import adapter

    C.setup_sdk("simple")
    telemetry = build_telemetry("vllm", {})
    sizes = [(100, 2), (300, 2)] if smoke else [(1000, 9), (10000, 5), (100000, 2)]
    results: dict[str, Any] = {"machine": C.machine(), "sizes": {}}
    for n, reps in sizes:
        lengths = C.long_tail(n, seed=n)
        outputs = C.make_outputs(lengths, stats=True)
        params = C.make_params(lengths)
        prompts = [f"p{i}" for i in range(n)]

        class Bare:
            llm_engine = C._Engine(log_stats=True)

            def generate(self, prompts: Any, sampling_params: Any = None, *,
                         use_tqdm: bool = True) -> Any:
                return outputs

        class Inst(Bare):
            pass

        wrapt.wrap_function_wrapper(Inst, "generate",
                                    adapter.offline_wrapper(telemetry, "text_completion"))
        recs = records_for(outputs, params, "tiny-llama-v1", "text_completion", True)
        ctx = trace.set_span_in_context(telemetry.tracer.start_span("rollout.batch"))
        floor = floor_for(telemetry, recs, lambda: ctx)
        del recs
        calls = {"A": lambda: Inst().generate(prompts, params, use_tqdm=False),
                 "B": lambda: Bare().generate(prompts, params, use_tqdm=False),
                 "F": floor}
        if n <= 10000:
            for fn in calls.values():
                fn()
        ours, fl, cpu = [], [], []
        gc.collect()
        for r in range(reps):
            t: dict[str, float] = {}
            c: dict[str, float] = {}
            for key in ("ABF", "FBA")[r % 2]:
                c0, w0 = time.thread_time(), time.perf_counter()
                calls[key]()
                t[key], c[key] = time.perf_counter() - w0, time.thread_time() - c0
                gc.collect()
            ours.append((t["A"] - t["B"]) * 1e3)
            cpu.append((c["A"] - c["B"]) * 1e3)
            fl.append(t["F"] * 1e3)
        res = {"requests": n, "ours_ms": C.band(ours, 1), "ours_cpu_ms": C.band(cpu, 1),
               "floor_ms": C.band(fl, 1),
               "ours_us_per_request": round(statistics.median(ours) * 1e3 / n, 2),
               "ours_cpu_us_per_request": round(statistics.median(cpu) * 1e3 / n, 2),
               "floor_us_per_request": round(statistics.median(fl) * 1e3 / n, 2)}
        results["sizes"][str(n)] = res
        print(n, res, flush=True)
        del outputs, params, calls, floor
        gc.collect()
    # CPU time: on a shared 2-core machine wall time also counts other people's processes.
    per = [v["ours_cpu_us_per_request"] for v in results["sizes"].values()]
    results["growth_per_request_last_over_first"] = round(per[-1] / per[0], 2)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    C.write(args.out, run(args.smoke))


if __name__ == "__main__":
    main()
