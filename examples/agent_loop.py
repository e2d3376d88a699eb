"""A small multi-turn agent loop on vLLM: each sample is a trajectory of two turns, a real tool
call (a Python snippet run in a subprocess) and a reward, under one training step.

    python examples/agent_loop.py --model PATH --samples 4

    # with export (OTLP gRPC on :4317): prefix opentelemetry-instrument, as for any job
    OTEL_SERVICE_NAME=agent OTEL_TRACES_EXPORTER=otlp OTEL_METRICS_EXPORTER=otlp \\
        opentelemetry-instrument python examples/agent_loop.py --model PATH

What otel_rollout adds is three context managers around what the loop already does:
``rollout_trajectory`` per sample, ``rollout_tool`` around the tool call, ``rollout_scoring``
around the reward. The engine's requests inside a trajectory are counted as its turns. The loop
also keeps its own record of what it did (:class:`Sample`), which the test compares with the
spans. On a CPU build of vLLM, ``VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0``
start fast.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from otel_rollout import rollout_step
from otel_rollout.trajectories import rollout_scoring, rollout_tool, rollout_trajectory


@dataclass
class Sample:
    """The loop's own record of one trajectory, kept without otel_rollout."""

    sample_id: int
    turns: int = 0
    output_tokens: int = 0
    generate_s: float = 0.0
    tool_s: float = 0.0
    tool_calls: int = 0
    reward: float = 0.0
    texts: list[str] = field(default_factory=list)


def run_tool(text: str) -> str:
    """The tool: Python in a subprocess, as a sandboxed code-execution tool would run it."""
    snippet = f"print(len({text!r}.split()))"
    done = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


def reward_of(texts: list[str]) -> float:
    return (sum(len(t) for t in texts) % 11) / 10.0


def agent_loop(llm: Any, vllm: Any, step: int, lengths: list[tuple[int, int]]) -> list[Sample]:
    """One step: a trajectory per ``(first turn length, second turn length)``."""
    samples = []
    with rollout_step(step):
        for i, (first, second) in enumerate(lengths):
            sample = Sample(i)
            with rollout_trajectory("tool_agent", sample_id=i, group_id=i // 2) as trajectory:
                prompt = f"Question {i}: count the words of your answer."
                for turn, tokens in enumerate((first, second)):
                    params = vllm.SamplingParams(max_tokens=tokens, ignore_eos=True)
                    started = time.monotonic()
                    (out,) = llm.generate([prompt], params, use_tqdm=False)
                    sample.generate_s += time.monotonic() - started
                    sample.turns += 1
                    sample.output_tokens += len(out.outputs[0].token_ids)
                    sample.texts.append(out.outputs[0].text)
                    if turn == 0:
                        started = time.monotonic()
                        with rollout_tool("python", call_id=f"{i}-0"):
                            result = run_tool(out.outputs[0].text)
                        sample.tool_s += time.monotonic() - started
                        sample.tool_calls += 1
                        prompt = f"{prompt}\n{out.outputs[0].text}\nTool said: {result}\n"
                with rollout_scoring():
                    sample.reward = reward_of(sample.texts)
                trajectory.set_reward(sample.reward)
            samples.append(sample)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    import vllm

    from otel_rollout import VLLMInstrumentor

    VLLMInstrumentor().instrument()
    llm = vllm.LLM(model=args.model, enforce_eager=True, max_model_len=2048)
    lengths = [(8 + 8 * (i % 3), 4 + 16 * (i % 2)) for i in range(args.samples)]
    for s in agent_loop(llm, vllm, 1, lengths):
        print(
            f"sample {s.sample_id}: {s.turns} turns, {s.output_tokens} tokens, "
            f"generate {s.generate_s:.3f} s, tool {s.tool_s:.3f} s, reward {s.reward:.1f}"
        )


if __name__ == "__main__":
    main()
