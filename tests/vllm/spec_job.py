"""Speculative decoding on real vLLM, in a process of its own: once vLLM's n-gram speculator has
loaded (numba), vLLM 0.32 fails to build any further engine in the process (its kernel-override
scan trips over a numba object), so this engine must not share the suite's process.

Runs one ``rollout_step`` of repetitive prompts on an instrumented ``LLM`` with the n-gram
speculator, stats on and ``per_request_spec_decode_metrics="summary"``, and prints one JSON line:
vLLM's own per-request counts, our request spans' attributes, the step's engine figures and its
span's attributes.
"""

from __future__ import annotations

import argparse
import json

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from testkit.engines import VLLM_KWARGS, vllm_environment


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    vllm_environment()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    from otel_rollout import VLLMInstrumentor, rollout_step
    from otel_rollout.sdk import force_flush

    VLLMInstrumentor().instrument()
    import vllm

    llm = vllm.LLM(
        model=args.model,
        disable_log_stats=False,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 2,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        },
        per_request_spec_decode_metrics="summary",
        **VLLM_KWARGS,
    )
    prompts = [" ".join(["one two three four"] * (4 + i)) for i in range(4)]
    params = vllm.SamplingParams(max_tokens=48, ignore_eos=True, temperature=0)
    with rollout_step(41) as step:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    force_flush()
    engine = {}
    for out in outputs:
        (seq,) = out.outputs
        m = seq.spec_decode_metrics
        engine[out.request_id] = (
            None
            if m is None
            else {
                "drafted": m.num_draft_tokens,
                "histogram": list(m.histogram),
                "rate": m.to_dict()["draft_acceptance_rate"],
            }
        )
    spans = [
        {"name": s.name, "attributes": dict(s.attributes or {})}
        for s in exporter.get_finished_spans()
    ]
    e = step.stats.engine if step.stats else None
    print(
        json.dumps(
            {
                "engine": engine,
                "spans": spans,
                "step_engine": None
                if e is None
                else [e.spec_draft_tokens, e.spec_accepted_tokens, e.spec_acceptance_rate],
            }
        )
    )
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
