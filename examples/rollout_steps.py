"""A training loop's rollout phase on vLLM, one ``rollout_step`` per step, with long-tail reports.

    python examples/rollout_steps.py --model PATH --steps 3 --batch 64

    # with export to a Collector (OTLP gRPC on :4317):
    OTEL_SERVICE_NAME=rollout OTEL_TRACES_EXPORTER=otlp OTEL_METRICS_EXPORTER=otlp \\
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 \\
        opentelemetry-instrument python examples/rollout_steps.py --model PATH

Each step generates a heavy-tailed mix of response lengths, like RL rollouts: most responses are
short, a few run to the maximum, and those asking for more than ``--max-tokens`` are cut off
(``finish_reason=length``). Each step runs as a trainer's would: generation, reward and the
policy update as ``rollout_phase``s, then a weight reload through vLLM's own ``collective_rpc``
(timed zero-code as the step's ``weight_sync``). The step summary (``OTEL_ROLLOUT_STEP_SUMMARY``,
with its phases and weight-version lines) is printed after every step; at the end the script prints latency and length quantiles over all requests and the
slowest requests with the trace ids to look up in Tempo/Jaeger.

Set ``OTEL_ROLLOUT_REPORT_DIR=DIR`` for a PNG per step (needs ``otel-rollout[report]``).
On a CPU build of vLLM, ``VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0`` start fast.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from otel_rollout import VLLMInstrumentor, rollout_phase, rollout_step
from otel_rollout.sdk import configure_from_environment


@dataclass(frozen=True)
class Finished:
    latency_s: float
    output_tokens: int
    finish_reason: str
    step: int | None
    trace_id: str


class RequestCollector(SpanProcessor):
    """Keeps every finished request span: the end-of-run table is built from what was exported.

    Request spans are the ones carrying ``gen_ai.usage.output_tokens``; step and batch spans
    are skipped.
    """

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.requests: list[Finished] = []
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        attrs = span.attributes or {}
        tokens = attrs.get("gen_ai.usage.output_tokens")
        if tokens is None or span.start_time is None or span.end_time is None:
            return
        reasons = attrs.get("gen_ai.response.finish_reasons") or ["-"]
        step = attrs.get("rollout.step")
        finished = Finished(
            (span.end_time - span.start_time) / 1e9,
            int(str(tokens)),
            str(reasons[0]),
            int(str(step)) if step is not None else None,
            format(span.context.trace_id, "032x"),
        )
        with self._lock:
            self.requests.append(finished)


def telemetry() -> RequestCollector:
    """Use the SDK that ``opentelemetry-instrument`` installed, or configure one from ``OTEL_*``.

    A plain ``python`` run gets the same set-up as under ``opentelemetry-instrument``
    (``configure_from_environment``: the distro's configurator and the instrumentors).
    """
    configure_from_environment()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # e.g. another SDK-compatible provider
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    collector = RequestCollector(provider)
    provider.add_span_processor(collector)
    instrumentor = VLLMInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:  # opentelemetry-instrument did it
        instrumentor.instrument()
    return collector


def heavy_tailed_lengths(n: int, cap: int, rng: random.Random) -> list[int]:
    """Requested lengths: Pareto (alpha 1.1) from ``cap/16``; about 1 in 20 wants more than ``cap``."""
    return [int(cap / 16 * rng.paretovariate(1.1)) for _ in range(n)]


def sampling_params(vllm: Any, lengths: list[int], cap: int, stop_ids: list[int]) -> list[Any]:
    """Exact response lengths on any model, even random weights.

    A request that wants ``n < cap`` tokens must produce ``n`` (``min_tokens``) and then stops at
    the first token from a large stop set — a stand-in for an end-of-sequence decision. Longer
    ones are cut at ``max_tokens=cap``, which is what truncation looks like in RL rollouts.
    """
    out = []
    for n in lengths:
        if n < cap:
            out.append(
                vllm.SamplingParams(
                    min_tokens=n, max_tokens=cap, stop_token_ids=stop_ids, temperature=1.0
                )
            )
        else:
            out.append(vllm.SamplingParams(max_tokens=cap, ignore_eos=True, temperature=1.0))
    return out


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model name or local path")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64, help="requests per step")
    parser.add_argument("--max-tokens", type=int, default=256, help="response length cap")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--dtype", default="auto", help="vLLM's dtype (auto: the checkpoint's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slowest", type=int, default=5, help="slowest requests to list")
    args = parser.parse_args()

    os.environ.setdefault("OTEL_ROLLOUT_STEP_SUMMARY", "1")  # read when each step opens
    collector = telemetry()

    import vllm

    llm = vllm.LLM(
        model=args.model, max_model_len=args.max_model_len, enforce_eager=True, dtype=args.dtype
    )
    vocab = len(llm.get_tokenizer())
    stop_ids = list(range(4, vocab, 2))
    rng = random.Random(args.seed)

    for step in range(1, args.steps + 1):
        lengths = heavy_tailed_lengths(args.batch, args.max_tokens, rng)
        prompts = [
            f"Problem {step}.{i}: explain your reasoning step by step." for i in range(args.batch)
        ]
        with rollout_step(step):
            with rollout_phase("generation"):
                outputs = llm.generate(
                    prompts,
                    sampling_params(vllm, lengths, args.max_tokens, stop_ids),
                    use_tqdm=False,
                )
            with rollout_phase("reward"):  # score the samples (here: a toy length reward)
                rewards = [len(o.outputs[0].token_ids) / args.max_tokens for o in outputs]
            with rollout_phase("actor_update"):
                # ... the policy update on (outputs, rewards) would run here ...
                sum(rewards)
            # The new weights reach the engine through vLLM's own worker RPC: an engine
            # operation, timed zero-code as the step's weight_sync phase (the same tiny
            # weights are reloaded; what matters is the real code path).
            llm.collective_rpc("reload_weights")

    collector.provider.force_flush()  # export what is batched before the table is printed
    done = collector.requests
    if not done:
        print("no request spans were recorded (is vLLM instrumented?)")
        return
    latencies = [r.latency_s for r in done]
    lengths_out = [float(r.output_tokens) for r in done]
    truncated = sum(1 for r in done if r.finish_reason == "length")
    print(
        f"\n{len(done)} requests over {args.steps} steps, {truncated} truncated at "
        f"max_tokens={args.max_tokens}"
    )
    print(f"{'':>9} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    print(
        f"{'latency':>9} "
        + " ".join(f"{quantile(latencies, q):7.3f}s" for q in (0.5, 0.9, 0.99, 1.0))
    )
    print(
        f"{'length':>9} "
        + " ".join(f"{quantile(lengths_out, q):8.0f}" for q in (0.5, 0.9, 0.99, 1.0))
    )
    print(f"\nslowest {args.slowest} requests:")
    for r in sorted(done, key=lambda r: r.latency_s, reverse=True)[: args.slowest]:
        print(
            f"  step {r.step}  {r.latency_s:7.3f} s  {r.output_tokens:6d} tokens  "
            f"{r.finish_reason:<6}  trace_id={r.trace_id}"
        )


if __name__ == "__main__":
    main()
