"""A small instrumented rollout for end-to-end tests, run as its own process.

Meant to run under ``opentelemetry-instrument`` so that everything — providers, exporters, our
instrumentor — is set up the zero-code way, from environment variables alone. It runs a few
``rollout_step``s of a long-tailed batch on the real vLLM CPU engine (with ``--phases``, each
step's generation and a scoring as its phases, ``rollout_phase``; with ``--weight-sync`` a weight
reload through vLLM's ``collective_rpc`` at its end; with ``--agents`` its prompts as
agentic trajectories, ``rollout_trajectory``), prints one JSON line per
request (the truth the test compares telemetry against), prints ``DONE``, and then stays alive
until its standard input closes so a scraper can read its metrics endpoint.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from otel_rollout import rollout_phase, rollout_step
from otel_rollout.sdk import force_flush
from otel_rollout.trajectories import rollout_scoring, rollout_tool, rollout_trajectory
from testkit.engines import VLLM_KWARGS, long_tail_lengths, stop_after, vllm_environment


def agentic(llms: list[Any], prompts: list[str], params: list[Any], agents: int) -> list[Any]:
    """The step's prompts as ``agents`` trajectories: each generates its share (on engine
    ``k mod len(llms)``: the replicas), calls a tool (a Python subprocess) and scores; the
    requests are the same as without trajectories."""
    outputs: list[Any] = []
    for k in range(agents):
        llm = llms[k % len(llms)]
        with rollout_trajectory("e2e_agent", sample_id=k) as trajectory:
            outputs += llm.generate(prompts[k::agents], params[k::agents], use_tqdm=False)
            with rollout_tool("python"):
                subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
            with rollout_scoring():
                trajectory.set_reward(float(len(outputs) % 3))
    return outputs


def generate(llms: list[Any], prompts: list[str], params: list[Any], agents: int) -> list[Any]:
    if agents:
        return agentic(llms, prompts, params, agents)
    return list(llms[0].generate(prompts, params, use_tqdm=False))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--linger", action="store_true", help="wait for stdin to close")
    parser.add_argument(
        "--engine-stats",
        action="store_true",
        help="LLM(disable_log_stats=False): exact engine timings incl. queue time",
    )
    parser.add_argument(
        "--phases", action="store_true", help="generation and scoring as the steps' phases"
    )
    parser.add_argument(
        "--weight-sync",
        action="store_true",
        help="end each step with a weight reload through vLLM's own worker RPC (an engine "
        "operation: weight_sync phase, held time, weight versions)",
    )
    parser.add_argument(
        "--agents",
        type=int,
        default=0,
        help="split each step's prompts over this many agentic trajectories, each a generate, "
        "a real tool call (a subprocess) and a scoring",
    )
    parser.add_argument(
        "--natural-stops",
        action="store_true",
        help="requests stop (finish_reason stop) right after their length instead of at "
        "max_tokens; every 100th still truncated (finish_reason length)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="engines (LLM objects) serving the steps; with --agents, agent k on engine k mod N",
    )
    args = parser.parse_args()
    vllm_environment()
    import vllm

    llms = [
        vllm.LLM(model=args.model, disable_log_stats=not args.engine_stats, **VLLM_KWARGS)
        for _ in range(args.replicas)
    ]
    for step in range(1, args.steps + 1):
        lengths = long_tail_lengths(args.batch, seed=step, high=160)
        params = [
            vllm.SamplingParams(max_tokens=n, ignore_eos=True)
            if not args.natural_stops or i % 100 == 0
            else stop_after(vllm.SamplingParams, n)
            for i, n in enumerate(lengths)
        ]
        prompts = [f"step {step} prompt {i}" for i in range(len(lengths))]
        with rollout_step(step):
            if not args.phases:
                outputs = generate(llms, prompts, params, args.agents)
            else:
                with rollout_phase("generation"):
                    outputs = generate(llms, prompts, params, args.agents)
                with rollout_phase("reward"):  # what a trainer does next: score the samples
                    sum(len(set(o.outputs[0].token_ids)) for o in outputs)
            if args.weight_sync:  # the trainer's new weights (the same tiny ones) reach vLLM
                for llm in llms:
                    llm.collective_rpc("reload_weights")
        for out in outputs:
            print(
                json.dumps(
                    {
                        "step": step,
                        "request_id": out.request_id,
                        "output_tokens": len(out.outputs[0].token_ids),
                    }
                ),
                flush=True,
            )
    force_flush()  # ours: the background emitter, then the SDK's providers
    print("DONE", flush=True)
    if args.linger:
        sys.stdin.read()


if __name__ == "__main__":
    main()
