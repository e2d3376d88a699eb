"""``SGLangInstrumentor``: the wrap/unwrap pairs for SGLang; the translation lives in ``adapter``."""

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
from otel_rollout.sglang import adapter

_logger = logging.getLogger(__name__)

MIN_VERSION = (0, 5)


def _targets(telemetry: Any) -> list[tuple[str, str, Callable[..., Any]]]:
    """(module, Class.method, wrapper) for every patch; the same list drives the unwrap."""
    engine = "sglang.srt.entrypoints.engine"
    return [
        ("sglang.srt.managers.tokenizer_manager", "TokenizerManager.generate_request",
         adapter.generate_request_wrapper(telemetry)),
        (engine, "Engine.generate", adapter.engine_wrapper),
        (engine, "Engine.async_generate", adapter.async_engine_wrapper),
        (engine, "Engine.__init__", watch_global_tracer_provider("SGLang")),
    ]


class SGLangInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Spans and metrics for every generate request SGLang serves in this process."""

    def instrumentation_dependencies(self) -> Collection[str]:
        # Deliberately empty, as for vLLM: SGLang ships under several distribution names
        # (``sglang``, ``sglang[all]`` builds, vendor forks), so the version is checked on the
        # module itself in _instrument.
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        self._patched: list[tuple[str, str]] = []
        version = module_version("sglang")
        if version is None:
            _logger.debug("otel_rollout: sglang is not importable; nothing to instrument")
            return
        if version_tuple(version) < MIN_VERSION and version not in ("dev", "unknown"):
            _logger.warning("otel_rollout: SGLang %s is older than the supported %s; SGLang is "
                            "not instrumented", version, ".".join(map(str, MIN_VERSION)))
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
            _logger.warning("otel_rollout: SGLang %s lacks %s; those paths are not instrumented, "
                            "the rest are", version, ", ".join(missing))

    def _uninstrument(self, **kwargs: Any) -> None:
        import importlib

        for module, name in reversed(getattr(self, "_patched", [])):
            owner_name, method = name.rsplit(".", 1)
            unwrap(getattr(importlib.import_module(module), owner_name), method)
        self._patched = []
