"""One RL-sized offline call, then exit at once: run under ``opentelemetry-instrument``.

``--prompts N``: one real ``LLM.generate`` of N prompts on the tiny model (verl's 1024 × 8 as its
agent loop sends them: one request each). ``--standin N``: no engine — the instrumentor's own
offline wrapper around a stand-in ``generate`` that returns N real ``vllm.outputs.RequestOutput``
objects (the 10× case, which the CPU engine would take minutes to produce). Either way the job
prints ``DONE <requests> <epoch>`` and returns: nothing flushes but what a user gets at exit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def standin_outputs(n: int) -> list[Any]:
    from vllm.outputs import CompletionOutput, RequestOutput

    outputs = []
    for i in range(n):
        tokens = 1 + i % 16
        choice = CompletionOutput(
            index=0,
            text="x" * tokens,
            token_ids=list(range(tokens)),
            cumulative_logprob=None,
            logprobs=None,
            finish_reason="length",
        )
        outputs.append(
            RequestOutput(
                request_id=str(i),
                prompt=None,
                prompt_token_ids=[1, 2, 3],
                prompt_logprobs=None,
                outputs=[choice],
                finished=True,
                metrics=None,
                num_cached_tokens=0,
            )
        )
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--prompts", type=int, default=0)
    parser.add_argument("--standin", type=int, default=0)
    args = parser.parse_args()
    from testkit.engines import VLLM_KWARGS, vllm_environment

    vllm_environment()
    import vllm

    params = vllm.SamplingParams(max_tokens=2, ignore_eos=True)
    if args.prompts:
        llm = vllm.LLM(model=args.model, **VLLM_KWARGS)
        outputs = llm.generate([f"prompt {i}" for i in range(args.prompts)], params, use_tqdm=False)
    else:
        import wrapt

        from otel_rollout.vllm import adapter
        from testkit.engines import vllm_telemetry

        outputs = standin_outputs(args.standin)

        class StandIn:  # what the instrumentor wraps, minus the engine
            class llm_engine:
                log_stats = False

            model_config = type(
                "ModelConfig", (), {"served_model_name": "standin", "model": "standin"}
            )()

            def generate(
                self, prompts: Any, sampling_params: Any = None, *, use_tqdm: bool = True
            ) -> Any:
                return outputs

        # The telemetry opentelemetry-instrument's VLLMInstrumentor made (bound exit included).
        wrapt.wrap_function_wrapper(
            StandIn, "generate", adapter.offline_wrapper(vllm_telemetry(), "text_completion")
        )
        outputs = StandIn().generate([str(i) for i in range(args.standin)], params)
    print(f"DONE {len(outputs)} {time.time():.6f}", flush=True)


def run_burst(
    endpoint: str, *job_args: str, timeout: float, service: str = "burst"
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run this job under ``opentelemetry-instrument`` exporting over OTLP/gRPC to ``endpoint``
    with the SDK's defaults (BatchSpanProcessor queue 2,048, batch 512, 5 s delay); returns the
    finished process and the seconds from ``generate`` returning to the process being gone."""
    from testkit.engines import VLLM_ENV

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(VLLM_ENV)
    env.update(
        PYTHONPATH=str(REPO),
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_LOGS_EXPORTER="none",
        OTEL_SERVICE_NAME=service,
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
    )
    command = [
        str(Path(sys.executable).parent / "opentelemetry-instrument"),
        sys.executable,
        str(Path(__file__)),
        *job_args,
    ]
    proc = subprocess.run(
        command,
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    gone = time.time()
    if proc.returncode != 0:
        raise AssertionError(proc.stderr[-4000:])
    (done,) = [line for line in proc.stdout.splitlines() if line.startswith("DONE")]
    return proc, gone - float(done.split()[2])


if __name__ == "__main__":
    main()
