"""TEST-ENVIRONMENT STAND-IN for the missing ``sgl_kernel`` binary (CPU build) -- not the real thing.

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports a few CPU ops from the compiled
``sgl_kernel`` extension, but no CPU build of that extension is published on PyPI (the
``sglang-kernel`` distribution there is CUDA-only). On a CPU without AMX, with
``attention_backend="torch_native"``, a plain generate reaches exactly one of them:
``assign_req_to_token_pool_cpu`` (called from ``sglang/srt/mem_cache/allocation.py``).

This package provides that single op in pure torch, so the *real* SGLang engine can run in
tests on CPU-only machines. SGLang also imports other CPU ops by name at module level (e.g.
``copy_all_layer_kv_cache_cpu`` in ``sglang/kernels/ops/kvcache/cache_move.py``) without calling
them in a plain generate, so every other name -- here or in a submodule -- resolves to a stub
that raises ``NotImplementedError`` naming the op as soon as it is *called*: a new dependency of
SGLang on this binary is loud instead of silently wrong. Submodules SGLang may probe with
``try: import ... except ImportError`` (e.g. ``sgl_kernel.scalar_type``) are deliberately absent.

Use it only by putting ``testkit/sgl_kernel_standin`` on ``PYTHONPATH`` of a test process
(and of the engine's child processes, which inherit the environment). Never ship or install it.
"""

from __future__ import annotations

import torch

__version__ = "0.0.0+otel-rollout-test-standin"
IS_TEST_STANDIN = True

__all__ = ["assign_req_to_token_pool_cpu", "IS_TEST_STANDIN"]


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's newly allocated KV-cache slots into its row of ``req_to_token``.

    For request ``i`` (row ``r = req_pool_indices[i]``) with ``n = end_offset[i] - start_offset[i]``,
    ``req_to_token[r, start:end] = out_cache_loc[off:off + n]``, where ``off`` accumulates ``n`` over
    the requests in order. ``pool_len`` is ``req_to_token.shape[1]`` (kept for signature parity).
    Mutates ``req_to_token`` in place, like the kernel.
    """
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    if not (len(rows) == len(starts) == len(ends)):
        raise ValueError(
            "sgl_kernel stand-in: req_pool_indices/start_offset/end_offset lengths differ: "
            f"{len(rows)}/{len(starts)}/{len(ends)}"
        )
    off = 0
    for r, s, e in zip(rows, starts, ends, strict=False):
        n = e - s
        if n <= 0:
            continue
        if e > pool_len:
            raise IndexError(f"sgl_kernel stand-in: end offset {e} exceeds pool length {pool_len}")
        req_to_token[r, s:e] = out_cache_loc[off : off + n].to(req_to_token.dtype)
        off += n


def _missing(module: str, name: str) -> NotImplementedError:
    return NotImplementedError(
        f"{module}.{name} is not provided by the otel_rollout test stand-in for sgl_kernel "
        f"(testkit/sgl_kernel_standin). SGLang now calls the CPU op '{name}': implement it "
        "in the stand-in or avoid the code path that needs it."
    )


def make_stub(module: str, name: str):
    """A callable standing for a CPU op this stand-in does not implement."""

    def stub(*args, **kwargs):
        raise _missing(module, name)

    stub.__name__ = stub.__qualname__ = name
    stub.__module__ = module
    stub.__doc__ = f"Test stand-in stub: calling it raises NotImplementedError ({module}.{name})."
    stub.IS_TEST_STANDIN_STUB = True
    return stub


def module_getattr(module_globals: dict):
    """Build a module-level ``__getattr__`` that hands out (and caches) stubs for any op name."""
    module = module_globals["__name__"]

    def __getattr__(name: str):
        # Let Python's own protocol probes (copy, pickle, inspect, ...) fail the normal way.
        if name.startswith("_"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        stub = make_stub(module, name)
        module_globals[name] = stub
        return stub

    return __getattr__


__getattr__ = module_getattr(globals())
