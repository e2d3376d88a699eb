"""A small multi-turn agent loop on vLLM or SGLang: each sample is a trajectory of two turns, a
real tool call (a Python snippet run in a subprocess) and a reward, under one training step.

    python examples/agent_loop.py --model PATH --samples 4 [--engine sglang]
    OTEL_ROLLOUT_STEP_SUMMARY=true OTEL_ROLLOUT_REPORT_DIR=out python examples/agent_loop.py ...
        # the step's trajectories in the terminal, and out/step-000001.png: a lane per sample

    # with export (OTLP gRPC on :4317): prefix opentelemetry-instrument, as for any job
    OTEL_SERVICE_NAME=agent OTEL_TRACES_EXPORTER=otlp OTEL_METRICS_EXPORTER=otlp \\
        opentelemetry-instrument python examples/agent_loop.py --model PATH

What otel_rollout adds is three context managers around what the loop already does:
``rollout_trajectory`` per sample, ``rollout_tool`` around the tool call, ``rollout_scoring``
around the reward. The engine's requests inside a trajectory are counted as its turns. The loop
also keeps its own record of what it did (:class:`Sample`), which the test compares with the
spans. The loop is engine-neutral: it calls ``generate(prompt, max_tokens) -> (text, tokens)``,
made by :func:`vllm_generate` or :func:`sglang_generate`. On a CPU build of vLLM,
``VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0`` start fast.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
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
    wall_s: float = 0.0
    texts: list[str] = field(default_factory=list)


Generate = Callable[[str, int], tuple[str, int]]
"""One turn: ``(prompt, max_tokens) -> (text, tokens generated)``, exactly ``max_tokens`` long."""


def vllm_generate(llm: Any, vllm: Any) -> Generate:
    def generate(prompt: str, max_tokens: int) -> tuple[str, int]:
        params = vllm.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        return out.outputs[0].text, len(out.outputs[0].token_ids)

    return generate


def sglang_generate(engine: Any) -> Generate:
    def generate(prompt: str, max_tokens: int) -> tuple[str, int]:
        out = engine.generate(
            prompt=prompt, sampling_params={"max_new_tokens": max_tokens, "ignore_eos": True}
        )
        return out["text"], int(out["meta_info"]["completion_tokens"])

    return generate


def run_tool(text: str) -> str:
    """The tool: Python in a subprocess, as a sandboxed code-execution tool would run it."""
    snippet = f"print(len({text!r}.split()))"
    done = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


def reward_of(texts: list[str]) -> float:
    return (sum(len(t) for t in texts) % 11) / 10.0


def agent_loop(generate: Generate, step: int, lengths: list[tuple[int, int]]) -> list[Sample]:
    """One step: a trajectory per ``(first turn length, second turn length)``."""
    samples = []
    with rollout_step(step):
        for i, (first, second) in enumerate(lengths):
            sample = Sample(i)
            opened = time.monotonic()
            with rollout_trajectory("tool_agent", sample_id=i, group_id=i // 2) as trajectory:
                prompt = f"Question {i}: count the words of your answer."
                for turn, tokens in enumerate((first, second)):
                    started = time.monotonic()
                    text, generated = generate(prompt, tokens)
                    sample.generate_s += time.monotonic() - started
                    sample.turns += 1
                    sample.output_tokens += generated
                    sample.texts.append(text)
                    if turn == 0:
                        started = time.monotonic()
                        with rollout_tool("python", call_id=f"{i}-0"):
                            result = run_tool(text)
                        sample.tool_s += time.monotonic() - started
                        sample.tool_calls += 1
                        prompt = f"{prompt}\n{text}\nTool said: {result}\n"
                with rollout_scoring():
                    sample.reward = reward_of(sample.texts)
                trajectory.set_reward(sample.reward)
            sample.wall_s = time.monotonic() - opened
            samples.append(sample)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    args = parser.parse_args()
    generate: Generate
    if args.engine == "vllm":
        import vllm

        from otel_rollout import VLLMInstrumentor

        VLLMInstrumentor().instrument()
        llm = vllm.LLM(model=args.model, enforce_eager=True, max_model_len=2048)
        generate = vllm_generate(llm, vllm)
    else:
        import sglang

        from otel_rollout import SGLangInstrumentor

        SGLangInstrumentor().instrument()
        # SGLang on CPU needs more settings (tests/sglang/conftest.py); on a GPU these suffice
        generate = sglang_generate(sglang.Engine(model_path=args.model))
    lengths = [(8 + 8 * (i % 3), 4 + 16 * (i % 2)) for i in range(args.samples)]
    for s in agent_loop(generate, 1, lengths):
        print(
            f"sample {s.sample_id}: {s.turns} turns, {s.output_tokens} tokens, "
            f"generate {s.generate_s:.3f} s, tool {s.tool_s:.3f} s, reward {s.reward:.1f}"
        )


if __name__ == "__main__":
    main()
