"""TEST-ENVIRONMENT STAND-IN: a ``cpu`` platform for verl 0.9.1, so its trainer runs on this CPU box.

verl 0.9.1 has no CPU platform (``verl/plugin/platform``: ``nvidia``, ``npu``, ``rocm``; with no
accelerator it falls back to ``nvidia``). This module registers one through verl's own plugin
mechanism — ``PlatformRegistry.register`` — and is loaded in every verl process with
``VERL_USE_EXTERNAL_MODULES=testkit.verl_cpu_platform`` and chosen with ``VERL_PLATFORM=cpu``
(``../shared/FACTS.md``). verl's code is not changed. What the platform says:

* device ``cpu``, collective backend ``gloo``, Ray resource ``GPU`` (a logical resource the test's
  ``ray.init(num_gpus=1)`` declares: verl counts it, nothing uses it);
* no IPC: verl's own shared-memory fallback carries the FSDP → vLLM weight sync;
* a device module that is ``torch.cpu`` plus no-op memory calls and the host RNG.

Two fix-ups outside the platform interface:

* verl builds the process-group backend as ``"cpu:gloo,<device>:<backend>"``
  (``verl/utils/distributed.py``), which on this platform is ``"cpu:gloo,cpu:gloo"`` — a duplicate
  pair torch rejects; ``init_process_group`` here drops it.
* vLLM's CPU build packs each linear layer's weight for oneDNN and then *removes* the weight
  (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so a running engine cannot take
  new weights: verl's every-step weight sync fails with "'Parameter' object has no attribute
  'weight_loader'" (on CPUs whose oneDNN accepts bf16; where it does not, vLLM falls back to
  torch's linear and keeps the weight). The GPU build keeps its weights. Here the weight is kept
  (``remove_weight=False``); verl re-runs ``process_weights_after_loading`` after each sync,
  which packs the new weights.
"""

from __future__ import annotations

import contextlib
import functools
import os
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM = "cpu"


def _device_module() -> types.ModuleType:
    """``torch.cpu`` with what verl calls on ``torch.cuda`` that the CPU has no use for."""
    module = types.ModuleType("otel_rollout_testkit_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    def zero(*args: Any, **kwargs: Any) -> int:
        return 0

    for name in (
        "empty_cache",
        "ipc_collect",
        "set_per_process_memory_fraction",
        "reset_peak_memory_stats",
    ):
        setattr(module, name, nothing)
    for name in (
        "memory_allocated",
        "memory_reserved",
        "max_memory_allocated",
        "max_memory_reserved",
    ):
        setattr(module, name, zero)
    module.mem_get_info = lambda *a, **k: (8 << 30, 16 << 30)  # type: ignore[attr-defined]
    module.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[attr-defined]
    module.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)  # type: ignore[attr-defined]
    module.manual_seed = torch.manual_seed  # type: ignore[attr-defined]
    module.manual_seed_all = torch.manual_seed  # type: ignore[attr-defined]
    module.get_device_name = lambda *a, **k: "cpu"  # type: ignore[attr-defined]
    module.is_available = lambda: True  # type: ignore[attr-defined]
    return module


_DEVICE = _device_module()


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """The host CPU as verl's accelerator (test environments only)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM

    def current_device(self) -> Any:
        # "cpu", as torch.cpu.current_device() says: verl moves modules with
        # .to(device=get_device_id()), and an index would mean an accelerator.
        return torch.cpu.current_device()

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _one_backend_per_device(backend: Any) -> Any:
    """``"cpu:gloo,cpu:gloo"`` → ``"cpu:gloo"``: each ``device:backend`` pair once, in order."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    pairs = [p.strip() for p in backend.split(",") if p.strip()]
    return ",".join(dict.fromkeys(pairs))


if not getattr(torch.distributed.init_process_group, "_otel_rollout_testkit", False):
    _init_process_group = torch.distributed.init_process_group

    @functools.wraps(_init_process_group)
    def _init(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = _one_backend_per_device(kwargs["backend"])
        elif args:
            args = (_one_backend_per_device(args[0]), *args[1:])
        return _init_process_group(*args, **kwargs)

    _init._otel_rollout_testkit = True  # type: ignore[attr-defined]
    torch.distributed.init_process_group = _init


def _keep_linear_weights(module: Any) -> None:
    """``vllm.model_executor.layers.utils`` imported: pack for oneDNN, but keep the weight."""
    import wrapt

    def keep(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        layer = args[0] if args else kwargs["layer"]
        return wrapped(layer, remove_weight=False)

    if not isinstance(module.dispatch_cpu_unquantized_gemm, wrapt.FunctionWrapper):
        wrapt.wrap_function_wrapper(module, "dispatch_cpu_unquantized_gemm", keep)


def _register_vllm_hook() -> None:
    import wrapt

    wrapt.register_post_import_hook(_keep_linear_weights, "vllm.model_executor.layers.utils")


_register_vllm_hook()
