"""Real engines on CPU with the tiny local model, at the fastest settings these machines allow."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otel_rollout.telemetry import Telemetry


VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
VLLM_DTYPE = "float32"
"""Not bfloat16: with bfloat16 on a CPU that reports AMX, vLLM 0.32 picks its AMX attention
kernel, which on some of these machines' VMs dies of SIGILL at random (the engine core, offline
or in AsyncLLM's child; docs/ENGINE_NOTES.md). float32 takes its AVX-512 kernel;
the tiny model is as fast either way. A test-environment choice: nothing asserts the dtype."""
VLLM_KWARGS: dict[str, Any] = dict(
    distributed_executor_backend="uni", enforce_eager=True, dtype=VLLM_DTYPE, max_model_len=2048
)


def vllm_environment() -> None:
    for key, value in VLLM_ENV.items():
        os.environ.setdefault(key, value)


SGLANG_STANDIN = Path(__file__).resolve().parent / "sgl_kernel_standin"
"""The test-environment stand-in for ``sgl_kernel``, which has no CPU build on PyPI: it
provides the one op a plain generate reaches (FACTS.md)."""
SGLANG_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
SGLANG_MAX_TOTAL_TOKENS = 4096
"""The KV pool, bounded by tokens: the same engine whatever else holds memory."""
SGLANG_LOAD_ALLOWANCE = 2 << 30
"""What may leave free host memory while SGLang loads the tiny model — its own load (under
0.3 GB here: 0.05 of 6 GiB free sufficed in tests/sglang/test_busy_machine.py) and other jobs'
allocations meanwhile — with room to spare: :func:`sglang_mem_fraction` leaves it."""


def sglang_mem_fraction(available: int | None = None) -> float:
    """``mem_fraction_static`` for an engine that starts whatever else uses memory.

    On CPU SGLang 0.5.23 measures free host memory before and after loading the model and
    refuses to start unless after ≥ (1 − fraction) × before ("Loaded weights leave no GPU memory
    for the KV cache … Raise --mem-fraction-static above 0.060"): a fixed 0.05 failed once other
    jobs held 6–10 of the 24 GB. So the fraction is derived from what is free now, leaving
    :data:`SGLANG_LOAD_ALLOWANCE`; the pool itself stays bounded by
    :data:`SGLANG_MAX_TOTAL_TOKENS`, so a larger fraction allocates nothing more."""
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    return round(min(0.9, max(0.05, SGLANG_LOAD_ALLOWANCE / max(available, 1))), 3)


SGLANG_KWARGS: dict[str, Any] = dict(
    device="cpu",
    attention_backend="torch_native",
    dtype="bfloat16",
    max_total_tokens=SGLANG_MAX_TOTAL_TOKENS,
    disable_cuda_graph=True,
    skip_server_warmup=True,
)
"""SGLang's CPU engine settings for tests, benchmarks and the smoke script; with
``mem_fraction_static=sglang_mem_fraction()`` added where the engine starts
(:func:`sglang_kwargs`)."""


def sglang_kwargs(**overrides: Any) -> dict[str, Any]:
    """:data:`SGLANG_KWARGS` with the memory fraction for what is free now."""
    return {**SGLANG_KWARGS, "mem_fraction_static": sglang_mem_fraction(), **overrides}


def sglang_environment() -> None:
    """SGLang's CPU engine, in this process and the scheduler and detokenizer it spawns: the
    stand-in on ``sys.path`` and ``PYTHONPATH`` before sglang is imported."""
    for key, value in SGLANG_ENV.items():
        os.environ.setdefault(key, value)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(SGLANG_STANDIN) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(SGLANG_STANDIN), *paths])
    if str(SGLANG_STANDIN) not in sys.path:
        sys.path.insert(0, str(SGLANG_STANDIN))


def long_tail_lengths(n: int, seed: int = 0, low: int = 8, high: int = 256) -> list[int]:
    """Requested response lengths like RL rollouts: most short, a few near the maximum."""
    rng = random.Random(seed)
    lengths = []
    for _ in range(n):
        x = rng.paretovariate(1.2)  # heavy tail, x >= 1
        lengths.append(min(high, int(low * x)))
    lengths[-1] = high  # at least one straggler at the cap
    return lengths


def shutdown_async_llm(engine: Any) -> None:
    """Stop an AsyncLLM so that a later in-process LLM can still shut down.

    vLLM leaves its client zmq sockets to finalizers; with messages still queued for the dead
    engine core their default (infinite) linger makes a later context term (in a gc, e.g. the
    in-process LLM's shutdown) block forever. Close them now without lingering.
    """
    engine.shutdown()
    core = getattr(engine, "engine_core", None)
    contexts = [getattr(core, "ctx", None), getattr(getattr(core, "resources", None), "ctx", None)]
    for ctx in contexts:
        for sock in list(getattr(ctx, "_sockets", None) or ()):
            if not sock.closed:
                sock.close(linger=0)


def vllm_telemetry() -> Telemetry:
    """The Telemetry the current vLLM instrumentation writes to (held by its wrappers)."""
    from vllm.entrypoints.llm import LLM

    from otel_rollout.telemetry import Telemetry

    wrapper = LLM.__dict__["generate"]._self_wrapper
    for cell in wrapper.__closure__ or ():
        if isinstance(cell.cell_contents, Telemetry):
            return cell.cell_contents
    raise AssertionError("vLLM is not instrumented")


TINY_VOCAB = 1024
"""The tiny test model's vocabulary."""


def stop_after(sampling_params: Any, n: int) -> Any:
    """vLLM ``SamplingParams`` for a request that generates ``n`` tokens and then stops on its
    own (``finish_reason`` ``stop``), not at ``max_tokens``: half the vocabulary stops it once
    ``min_tokens`` are out, as an EOS would. Not all of it: vLLM
    masks the stop tokens until ``min_tokens``, and a fully masked vocabulary has nothing left
    to sample. 64 tokens of slack: ending at ``max_tokens`` would take 64 draws in a row from the
    other half."""
    return sampling_params(
        min_tokens=n, max_tokens=n + 64, stop_token_ids=list(range(0, TINY_VOCAB, 2))
    )
