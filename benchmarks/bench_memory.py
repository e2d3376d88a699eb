"""Figure 4: RSS growth over 100,000 instrumented requests; no per-request state left behind.

No engine runs. The real wrappers (wrapt, as the instrumentor applies them) drive stand-in
engines returning real ``vllm.outputs`` objects:

* async streams (``AsyncLLM.generate``), 8 chunks each, ending every way a stream ends:
  exhausted (60 %), consumer ``break`` + ``aclose()`` (10 %), task cancelled mid-stream (10 %),
  abandoned without closing and garbage-collected (10 %), engine error mid-stream (10 %);
* offline batches (``LLM.generate``, 250 requests per call (25 in --smoke), engine stats off, with the
  ``OutputProcessor`` hooks replayed per step) for a fifth of the requests.

After a warm-up (instruments, timeseries, exemplar reservoirs and the allocator reach steady
state), RSS is sampled every 10 % of the run; growth = last − first. Then ``gc`` is searched for
instances of every per-request class of ours, and the in-flight gauge must read 0.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

import _common as C


class EngineFailure(RuntimeError):
    pass


def run(smoke: bool) -> dict[str, Any]:
    import wrapt
    from vllm import SamplingParams

    from otel_rollout.instrumentation import build_telemetry
    from otel_rollout.vllm import adapter

    _, _, reader = C.setup_sdk("simple")
    telemetry = build_telemetry("vllm", {})
    total = 1000 if smoke else 100_000
    warmup = 200 if smoke else 10_000
    chunks = 8
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    hang = asyncio.Event

    def chunks_for(i: int) -> list[Any]:
        metrics = C.make_stats(time.time() - 1.0, time.monotonic() - 1.0, 16)
        return [
            C.make_output(
                f"r{i}", (k + 1) * 2, stats=True, finished=k == chunks - 1, metrics=metrics
            )
            for k in range(chunks)
        ]

    class BareAsyncLLM:
        model_config = C._ModelConfig()
        observability_config = None

        def generate(self, prompt: Any, sampling_params: Any, request_id: str) -> Any:
            kind = prompt
            outs = chunks_for(int(request_id[1:]))

            async def gen() -> Any:
                for k, c in enumerate(outs):
                    if kind == "cancel" and k == 3:
                        await hang().wait()  # never set: the consumer's task gets cancelled here
                    if kind == "error" and k == 3:
                        raise EngineFailure("engine died")
                    await asyncio.sleep(0)
                    yield c

            return gen()

    class InstAsyncLLM(BareAsyncLLM):
        pass

    wrapt.wrap_function_wrapper(InstAsyncLLM, "generate", adapter.async_generate_wrapper(telemetry))
    engine = InstAsyncLLM()

    # offline: stand-in LLM with the hooks replayed
    class Processor:
        def add_request(self, request: Any) -> None:
            pass

        def process_outputs(
            self,
            engine_core_outputs: Any,
            engine_core_timestamp: Any = None,
            iteration_stats: Any = None,
        ) -> None:
            pass

    wrapt.wrap_function_wrapper(Processor, "add_request", adapter.add_request_wrapper(telemetry))
    wrapt.wrap_function_wrapper(
        Processor, "process_outputs", adapter.process_outputs_wrapper(telemetry)
    )

    class Req:
        def __init__(self, i: int) -> None:
            self.request_id, self.external_req_id, self.arrival_time = f"{i}-x", str(i), time.time()

    class ECO:
        def __init__(self, rid: str, finish: Any) -> None:
            self.request_id, self.new_token_ids, self.finish_reason = rid, [1], finish

    class LLM:
        llm_engine = C._Engine(log_stats=False)

        def generate(
            self, prompts: Any, sampling_params: Any = None, *, use_tqdm: bool = True
        ) -> Any:
            proc = Processor()
            reqs = [Req(int(p)) for p in prompts]
            for r in reqs:
                proc.add_request(r)
            for s in range(4):
                proc.process_outputs(
                    [ECO(r.request_id, "length" if s == 3 else None) for r in reqs],
                    time.monotonic(),
                    None,
                )
            return [C.make_output(r.external_req_id, 4, stats=False) for r in reqs]

    wrapt.wrap_function_wrapper(
        LLM, "generate", adapter.offline_wrapper(telemetry, "text_completion")
    )
    llm = LLM()
    loop = asyncio.new_event_loop()
    kinds = ["done"] * 6 + ["break", "cancel", "abandon", "error"]

    async def one(i: int, kind: str) -> None:
        stream = engine.generate(kind, params, f"r{i}")
        if kind == "break":
            async for _ in stream:
                break
            await stream.aclose()
        elif kind == "abandon":
            await stream.__anext__()
            del stream  # dropped unfinished: closed by asyncio's async-generator finalizer
        else:
            try:
                async for _ in stream:
                    pass
            except EngineFailure:
                pass

    async def streams(start: int, count: int) -> None:
        tasks = [
            asyncio.ensure_future(one(i, kinds[i % len(kinds)]))
            for i in range(start, start + count)
        ]
        await asyncio.sleep(0.001)
        await asyncio.sleep(0)
        for t, i in zip(tasks, range(start, start + count), strict=False):
            if kinds[i % len(kinds)] == "cancel":
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    done = 0

    unit = 100 if smoke else 1000  # requests per driving round

    def drive(n: int) -> None:
        nonlocal done
        end = done + n
        while done < end:
            if (done // unit) % 5 == 4:  # every fifth round: offline batches
                for b in range(4):
                    llm.generate(
                        [str(done + b * unit // 4 + j) for j in range(unit // 4)],
                        None,
                        use_tqdm=False,
                    )
            else:
                loop.run_until_complete(streams(done, unit))
            done += unit

    from otel_rollout.emitter import flush_all

    drive(warmup)
    flush_all(120)  # records are emitted in the background: measure what is left once it is done
    reader.get_metrics_data()  # a collection, as a periodic reader would do
    gc.collect()
    samples = [C.rss_bytes()]
    steps = 10
    for _ in range(steps):
        drive(total // steps)
        flush_all(120)
        reader.get_metrics_data()
        gc.collect()
        samples.append(C.rss_bytes())

    ours = {
        "AsyncRequest",
        "RequestRecord",
        "StepTimes",
        "StepScope",
        "Clock",
    }
    live: dict[str, int] = {}
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in ours:
            live[name] = live.get(name, 0) + 1
    data = reader.get_metrics_data()
    active = count = 0
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    if m.name == "rollout.requests.active":
                        active += p.value
                    if m.name == "gen_ai.server.request.duration":
                        count += p.count
    mib = 2**20
    result = {
        "machine": C.machine(),
        "requests": total,
        "warmup_requests": warmup,
        "rss_start_mib": round(samples[0] / mib, 2),
        "rss_samples_growth_mib": [round((s - samples[0]) / mib, 2) for s in samples],
        "rss_growth_mib": round((samples[-1] - samples[0]) / mib, 2),
        "live_per_request_objects": live,
        "in_flight_gauge_after": active,
        "duration_points_total": count,
        "engine_activity_in_flight": {k: v.active for k, v in telemetry._engines.items()},
    }
    print(result, flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    C.write(args.out, run(args.smoke))


if __name__ == "__main__":
    main()
