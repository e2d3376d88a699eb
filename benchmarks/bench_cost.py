"""Figure 1: CPU time our instrumentation adds per finished request, next to the OTel SDK floor.

No engine runs. The real wrappers (``otel_rollout.vllm.adapter``, applied with wrapt exactly as the
instrumentor applies them) wrap stand-in engine methods that return real ``vllm.outputs``
objects, so what is timed is everything the instrumentation does per request:

* offline: ``LLM.generate`` of a 256-request long-tail batch. The stand-in replays the engine's
  ``OutputProcessor.add_request`` (once per request) and ``process_outputs`` (once per engine step,
  one output per running request: the real number of steps and outputs for those lengths) through
  the wrapped hooks, then returns the outputs. Two shapes: engine stats on
  (``LLM(disable_log_stats=False)``) and off (vLLM's default, timed from the engine steps).
* async: ``AsyncLLM.generate`` streams, consumed to the end, 16 cumulative chunks per request,
  engine stats on (``AsyncLLM``'s default: every output carries the engine's ``metrics``, and the
  stand-in says ``log_stats`` as the real engine does).

Per round, four things run back to back in rotating order: the instrumented call with the
background emitter (A, the default) followed by the wait until the emitter is done, the same with
``OTEL_ROLLOUT_EMIT_QUEUE=0`` (I, inline), the bare stand-in (B), and the floor (F): for the same
requests, what the SDK itself costs — ``tracer.start_span(start_time=…, attributes=<the very
dict we attach>)`` + the same ``add_event`` calls + ``end`` + the same histogram ``.record`` calls (same
instruments, same attribute sets, the span's context). ours = A − B in process CPU time
(``time.process_time``: the emitter's thread included — work moved off the caller still counts);
caller = the same in the calling thread's CPU time only; inline = I − B. Median over rounds.

``--histograms exponential|explicit`` picks the aggregation of the five long-tail histograms
(exponential through ``otel_rollout.histograms.views``, installed on the MeterProvider as a
process that builds its own provider would; explicit = the advisory buckets, no views);
``both`` runs each in its own process (one global MeterProvider per process) and reports them
side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import _common as C


def build(telemetry: Any, lengths: list[int], stats: bool) -> dict[str, Any]:
    import wrapt

    from otel_rollout.vllm import adapter

    outputs = C.make_outputs(lengths, stats=stats)
    params = C.make_params(lengths)
    prompts = [f"p{i}" for i in range(len(lengths))]

    class Request:  # what OutputProcessor.add_request receives (EngineCoreRequest fields we read)
        __slots__ = ("request_id", "external_req_id", "arrival_time")

        def __init__(self, i: int) -> None:
            self.request_id = f"{i}-abcd1234"
            self.external_req_id = str(i)
            self.arrival_time = time.time()

    class ECO:  # EngineCoreOutput fields the hook reads
        __slots__ = ("request_id", "new_token_ids", "finish_reason")

        def __init__(self, rid: str, finish: Any) -> None:
            self.request_id = rid
            self.new_token_ids = [1]
            self.finish_reason = finish

    requests = [Request(i) for i in range(len(lengths))]
    steps = [
        [
            ECO(r.request_id, "length" if n == s + 1 else None)
            for r, n in zip(requests, lengths, strict=False)
            if n > s
        ]
        for s in range(max(lengths))
    ]

    class BareProcessor:
        def add_request(self, request: Any) -> None:
            pass

        def process_outputs(
            self,
            engine_core_outputs: Any,
            engine_core_timestamp: Any = None,
            iteration_stats: Any = None,
        ) -> None:
            pass

    class BareLLM:
        def __init__(self, processor: Any) -> None:
            self.llm_engine = C._Engine(log_stats=stats)
            self.processor = processor

        def generate(
            self, prompts: Any, sampling_params: Any = None, *, use_tqdm: bool = True
        ) -> Any:
            proc = self.processor
            for r in requests:
                proc.add_request(r)
            for step in steps:
                proc.process_outputs(step, time.monotonic(), None)
            return outputs

    class InstProcessor(BareProcessor):
        pass

    class InstLLM(BareLLM):
        pass

    wrapt.wrap_function_wrapper(
        InstProcessor, "add_request", adapter.add_request_wrapper(telemetry)
    )
    wrapt.wrap_function_wrapper(
        InstProcessor, "process_outputs", adapter.process_outputs_wrapper(telemetry)
    )
    wrapt.wrap_function_wrapper(
        InstLLM, "generate", adapter.offline_wrapper(telemetry, "text_completion")
    )
    bare, inst = BareLLM(BareProcessor()), InstLLM(InstProcessor())
    return {
        "A": lambda: inst.generate(prompts, params, use_tqdm=False),
        "B": lambda: bare.generate(prompts, params, use_tqdm=False),
        "outputs": outputs,
        "params": params,
        "requests": len(lengths),
        "step_outputs": sum(lengths),
    }


def floor_for(telemetry: Any, records: list[Any], parent_fn: Any) -> Any:
    """The SDK floor for these records: same span attributes and histogram records, nothing else."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    from otel_rollout.semconv import EVENT_FIRST_TOKEN, EVENT_SCHEDULED, ROLLOUT_FINISH_REASON

    tracer = telemetry.tracer
    prepared = []
    for rec in records:
        attrs = telemetry._span_attributes(rec)
        mattrs = telemetry._base_attributes(rec.model, rec.operation)
        if rec.finish_reason is not None:
            mattrs[ROLLOUT_FINISH_REASON] = rec.finish_reason
        hist = [(telemetry.duration, rec.duration_s, mattrs)]
        if rec.ttft_s is not None:
            hist.append((telemetry.ttft, rec.ttft_s, mattrs))
        if rec.tpot_s is not None:
            hist.append((telemetry.tpot, rec.tpot_s, mattrs))
        if rec.queue_time_s is not None:
            hist.append((telemetry.queue_time, rec.queue_time_s, mattrs))
        tokens = telemetry.tokens.histogram  # the default conventions' one token histogram
        hist.append((tokens, rec.prompt_tokens, {**mattrs, "gen_ai.token.type": "input"}))
        hist.append((tokens, rec.output_tokens, {**mattrs, "gen_ai.token.type": "output"}))
        prepared.append(
            (
                f"{rec.operation} {rec.model}",
                rec.arrival_ns,
                rec.scheduled_ns,
                rec.first_token_ns,
                rec.finish_ns,
                attrs,
                hist,
            )
        )
    event, scheduled_event = EVENT_FIRST_TOKEN, EVENT_SCHEDULED
    internal = SpanKind.INTERNAL
    set_in = trace.set_span_in_context

    def floor() -> None:
        parent = parent_fn()
        for name, start, scheduled, first, end, attrs, hist in prepared:
            span = tracer.start_span(
                name, context=parent, kind=internal, start_time=start, attributes=attrs
            )
            if scheduled is not None:
                span.add_event(scheduled_event, timestamp=scheduled)
            if first is not None:
                span.add_event(event, timestamp=first)
            span.end(end_time=end)
            ctx = set_in(span, parent)
            for instrument, value, mattrs in hist:
                instrument.record(value, mattrs, context=ctx)

    return floor


def records_for(
    outputs: list[Any], params: list[Any], model: str, operation: str, stats: bool
) -> list[Any]:
    from otel_rollout.record import Clock
    from otel_rollout.vllm import adapter

    clock = Clock()
    now = clock.now_ns()
    times = None
    if not stats:  # what the hooks fill in: arrival, first token and finish per request
        times = adapter.StepTimes()
        for o in outputs:
            times.arrival[o.request_id] = time.time() - 1.0
            times.first[o.request_id] = time.monotonic() - 0.9
            times.finish[o.request_id] = time.monotonic() - 0.1
    recs = []
    for i, o in enumerate(outputs):
        rec = adapter.record_from_output(o, operation, model, clock, now - 10**9, now, times, False)
        adapter._fill_sampling(rec, params[i] if isinstance(params, list) else params)
        recs.append(rec)
    return recs


def async_case(telemetry: Any, n_requests: int, chunks: int) -> dict[str, Any]:
    import wrapt
    from vllm import SamplingParams

    from otel_rollout.vllm import adapter

    lengths = [chunks * 2] * n_requests
    streams = []
    for i, n in enumerate(lengths):
        metrics = C.make_stats(time.time() - 1.0, time.monotonic() - 1.0, n)
        streams.append(
            [
                C.make_output(
                    f"req-{i}",
                    (k + 1) * n // chunks,
                    stats=True,
                    finished=k == chunks - 1,
                    metrics=metrics,
                )
                for k in range(chunks)
            ]
        )
    params = SamplingParams(max_tokens=chunks * 2, ignore_eos=True)

    class BareAsyncLLM:
        model_config = C._ModelConfig()
        observability_config = None
        log_stats = True  # as AsyncLLM's own (its default): its outputs carry metrics

        def generate(self, prompt: Any, sampling_params: Any, request_id: str) -> Any:
            chunks_ = streams[int(request_id.rsplit("-", 1)[1])]

            async def gen() -> Any:
                for c in chunks_:
                    yield c

            return gen()

    class InstAsyncLLM(BareAsyncLLM):
        pass

    wrapt.wrap_function_wrapper(InstAsyncLLM, "generate", adapter.async_generate_wrapper(telemetry))
    loop = asyncio.new_event_loop()
    bare, inst = BareAsyncLLM(), InstAsyncLLM()

    def consume(engine: Any) -> Any:
        async def run() -> None:
            for i in range(n_requests):
                async for _ in engine.generate("p", params, f"req-{i}"):
                    pass

        return lambda: loop.run_until_complete(run())

    finals = [s[-1] for s in streams]
    records = records_for(finals, params, "tiny-llama-v1", "text_completion", True)
    from opentelemetry import context as otel_context

    return {
        "A": consume(inst),
        "B": consume(bare),
        "F": floor_for(telemetry, records, otel_context.get_current),
        "requests": n_requests,
        "chunks_per_request": chunks,
    }


def measure(case: dict[str, Any], rounds: int) -> dict[str, Any]:
    from otel_rollout.emitter import flush_all

    n = case["requests"]

    def background() -> None:
        case["A"]()
        assert flush_all(120), "the emitter did not catch up"

    calls = {"A": background, "I": case["I"], "B": case["B"], "F": case["F"]}
    for fn in calls.values():  # warm up caches, instruments, timeseries
        fn()
        fn()
    ours, caller, inline, floor, ratio, inline_ratio = [], [], [], [], [], []
    orders = ("ABFI", "BFIA", "FIAB", "IAFB", "BAIF", "FBAI")
    gc.collect()
    gc.disable()  # collections land wherever the allocator says; keep them out of the A/B split
    try:
        for r in range(rounds):
            t: dict[str, float] = {}
            th: dict[str, float] = {}
            for key in orders[r % len(orders)]:
                start, thread = time.process_time(), time.thread_time()
                calls[key]()
                t[key], th[key] = time.process_time() - start, time.thread_time() - thread
            gc.collect()
            o = (t["A"] - t["B"]) / n * 1e6
            i = (t["I"] - t["B"]) / n * 1e6
            f = t["F"] / n * 1e6
            ours.append(o)
            caller.append((th["A"] - th["B"]) / n * 1e6)
            inline.append(i)
            floor.append(f)
            ratio.append(o / f)
            inline_ratio.append(i / f)
    finally:
        gc.enable()
    return {
        "ours_us": C.band(ours, 2),
        "caller_us": C.band(caller, 2),
        "inline_us": C.band(inline, 2),
        "floor_us": C.band(floor, 2),
        "ratio": C.band(ratio, 3),
        "inline_ratio": C.band(inline_ratio, 3),
    }


def run(smoke: bool, histograms_mode: str = "explicit") -> dict[str, Any]:
    import dataclasses

    from otel_rollout import histograms
    from otel_rollout.config import load_config

    config = load_config({**os.environ, "OTEL_ROLLOUT_HISTOGRAMS": histograms_mode})
    C.setup_sdk("simple", views=histograms.views(config))
    from opentelemetry import trace

    from otel_rollout.instrumentation import build_telemetry
    from otel_rollout.telemetry import create_telemetry

    telemetry = build_telemetry("vllm", {})  # the default: background emitter
    inline = create_telemetry("vllm", config=dataclasses.replace(telemetry.config, emit_queue=0))
    rounds = 3 if smoke else 31
    size = 32 if smoke else 256
    lengths = C.long_tail(size, seed=1)
    results: dict[str, Any] = {
        "machine": C.machine(),
        "rounds": rounds,
        "batch": size,
        "histograms": histograms_mode,
    }

    for label, stats in (("offline_stats_on", True), ("offline_stats_off", False)):
        case = build(telemetry, lengths, stats)
        case["I"] = build(inline, lengths, stats)["A"]
        recs = records_for(
            case["outputs"], case["params"], "tiny-llama-v1", "text_completion", stats
        )
        batch_span = telemetry.tracer.start_span("rollout.batch")
        ctx = trace.set_span_in_context(batch_span)
        case["F"] = floor_for(telemetry, recs, lambda ctx=ctx: ctx)
        res = measure(case, rounds)
        res["step_outputs_per_request"] = round(case["step_outputs"] / case["requests"], 1)
        results[label] = res
        print(label, res, flush=True)

    case = async_case(telemetry, 32 if smoke else 256, 16)
    case["I"] = async_case(inline, 32 if smoke else 256, 16)["A"]
    res = measure(case, rounds)
    res["chunks_per_request"] = case["chunks_per_request"]
    results["async_stream"] = res
    print("async_stream", res, flush=True)
    return results


def both(smoke: bool) -> dict[str, Any]:
    """Explicit and exponential, each in a fresh process, then side by side per case."""
    out: dict[str, Any] = {}
    for mode in ("explicit", "exponential"):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"{mode}.json")
            cmd = [sys.executable, __file__, "--histograms", mode, "--out", path]
            subprocess.run(
                cmd + (["--smoke"] if smoke else []), check=True, stdout=subprocess.DEVNULL
            )
            with open(path) as f:
                out[mode] = json.load(f)
    cases = ("offline_stats_on", "offline_stats_off", "async_stream")
    out["side_by_side"] = {
        case: {
            mode: {k: out[mode][case][k] for k in ("ours_us", "floor_us")}
            for mode in ("explicit", "exponential")
        }
        for case in cases
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--histograms", choices=("explicit", "exponential", "both"), default="explicit")
    args = ap.parse_args()
    if args.histograms == "both":
        C.write(args.out, both(args.smoke))
    else:
        C.write(args.out, run(args.smoke, args.histograms))


if __name__ == "__main__":
    main()
