"""SDK set-up: the few process-wide changes otel_rollout makes to OpenTelemetry, each a named call.

Nothing here runs on import. :class:`~otel_rollout.instrumentation.EngineInstrumentor` calls
:func:`use_urandom_ids` and :func:`bound_exit` when it is instrumented (its ``_instrument`` says so
in one place); Ray workers call :func:`configure_from_environment`. Exporter choice, resources,
samplers and id generators are the SDK configurator's job (``opentelemetry-distro``): we use it
rather than writing our own.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from otel_rollout import emitter, sdk_internals
from otel_rollout.guard import PROCESS
from otel_rollout.ids import UrandomIdGenerator

__all__ = [
    "bound_exit",
    "configure_from_environment",
    "drain_before_provider_flush",
    "force_flush",
    "sdk_configured",
    "use_urandom_ids",
]

_logger = logging.getLogger(__name__)


def use_urandom_ids(provider: object) -> bool:
    """Swap the stock seeded-``random`` id generator of an SDK provider for ``os.urandom`` ids.

    vLLM (and most RL frameworks) call ``random.seed(0)`` when an engine starts; the SDK's default
    generator draws from that same generator, so every worker — and every run — would produce the
    same trace ids. Only the exact stock class is replaced; a generator the user chose is left
    alone. Tracers made from the provider afterwards (ours included) use the new generator.
    Returns whether it swapped.
    """
    if isinstance(provider, TracerProvider) and type(provider.id_generator) is RandomIdGenerator:
        provider.id_generator = UrandomIdGenerator()  # type: ignore[assignment]  # SDK annotates the stock class
        _logger.info(
            "otel_rollout: using os.urandom trace ids; engines seed Python's random, "
            "which would make ids repeat across workers and runs"
        )
        return True
    return False


@functools.lru_cache(maxsize=1)
def bound_exit(timeout_s: float) -> None:
    """Register (once per process) a bounded shutdown of the global providers at exit.

    The SDK shuts its providers down at exit and waits for the exporters; an OTLP exporter facing
    an unreachable or slow collector retries each signal's final export for up to
    ``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s by default) — measured at +28 s (refused port) to +40 s
    (black hole) on a vLLM run's exit. Ours runs that shutdown in a daemon thread and waits at most
    ``timeout_s`` (``OTEL_ROLLOUT_EXIT_TIMEOUT``) for it, replacing the SDK's own handler.

    Before that, request records still queued in the background emitter are emitted: the wait
    lasts while the emitter makes progress (80,000 records take seconds of CPU, and are what the
    run measured) and ends after ``timeout_s`` without any (see :mod:`otel_rollout.emitter`).
    """
    emitter.drain_at_exit_elsewhere()
    atexit.register(_shutdown_within, timeout_s)


def _shutdown_within(timeout_s: float) -> None:
    emitter.drain_all(timeout_s)
    # A drain of the span exporter is already stuck (collector down or hanging): the final
    # export would wait on the same exporter, so exit does not wait for it at all.
    stuck = emitter.exporter_stuck(max(timeout_s, emitter.exporter_timeout_s()))
    candidates: tuple[Any, ...] = (trace.get_tracer_provider(), metrics.get_meter_provider())
    providers = [p for p in candidates if sdk_internals.owns_exit_handler(p)]
    if not providers:
        return  # no SDK provider, or each already shut down by its owner
    for provider in providers:
        # The SDK registered its own unbounded shutdown at exit; ours replaces it.
        sdk_internals.unregister_exit_handler(provider)

    def shut(provider: Any) -> None:
        try:
            provider.shutdown()
        except Exception:  # exit must go on whatever the exporter does
            _logger.debug("otel_rollout: provider shutdown failed at exit", exc_info=True)

    # One thread per provider, all started (shutting an exporter down ends its retries): the
    # meter provider's final export is waited for even when the span exporter is stuck, so the
    # counts recorded at exit leave the process; a stuck span exporter is not waited for at all.
    deadline = time.monotonic() + timeout_s
    late = []
    for provider in providers:
        worker = threading.Thread(
            target=shut, args=(provider,), name="otel_rollout-exit", daemon=True
        )
        worker.start()
        spans = provider is candidates[0]
        worker.join(0.0 if stuck and spans else max(0.0, deadline - time.monotonic()))
        if worker.is_alive() and not (stuck and spans):
            late.append(provider)
    if stuck:
        _logger.warning(
            "otel_rollout: the span exporter did not answer; spans still buffered "
            "at exit are dropped so the process can end"
        )
    if late:
        _logger.warning(
            "otel_rollout: telemetry export did not finish within %.1f s of exit "
            "(OTEL_ROLLOUT_EXIT_TIMEOUT); the rest is dropped so the process can end",
            timeout_s,
        )


@functools.lru_cache(maxsize=1)
def drain_before_provider_flush() -> None:
    """Make the SDK providers' own ``force_flush()`` and ``shutdown()`` deliver our records.

    Request records wait in our background emitter after ``generate()`` returns; standard OTel
    code then calls ``tracer_provider.force_flush()`` (tests with ``InMemorySpanExporter``,
    shutdown paths, other libraries) and must find every span of the calls that already
    returned. No public hook runs before a provider's flush: a span processor is flushed in the
    order it was added (after the user's exporter), and a ``MeterProvider`` takes no reader after
    it was made. So this is the seam: ``force_flush`` and ``shutdown`` of the SDK's
    ``TracerProvider`` and ``MeterProvider`` first wait (within their own timeout) until every
    emitter has emitted what it was given, then do what they always did. Once per process, when
    the first emitter starts. Our own threads (pacing drains the provider) and the bounded exit
    (which has drained already) skip the wait.
    """
    sdk_internals.wrap_provider_flushes(_drain_first)


def _drain_first(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if emitter.in_emitter_thread() or emitter.exiting():
        return wrapped(*args, **kwargs)
    timeout_ms = kwargs.get("timeout_millis", args[0] if args else 30_000)
    started = time.monotonic()
    try:
        emitter.flush_all(max(0.0, float(timeout_ms) / 1000))
    except Exception:  # our failure must not stop the provider's own flush
        _logger.debug("otel_rollout: emitter flush before provider flush failed", exc_info=True)
    if args or "timeout_millis" in kwargs:
        left = max(0.0, float(timeout_ms) - (time.monotonic() - started) * 1000)
        kwargs = {**kwargs, "timeout_millis": int(left)}
        args = ()
    result = wrapped(*args, **kwargs)
    if result is True and isinstance(instance, TracerProvider):
        emitter.exporter_answered()  # the span exporter answers, however slowly
    return result


def sdk_configured() -> bool:
    """Whether this process already has an SDK tracer provider (``opentelemetry-instrument`` ran)."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)


def configure_from_environment() -> bool:
    """Do what ``opentelemetry-instrument`` does at start-up, in a process that started without it.

    The distro and its configurator read the standard ``OTEL_*`` variables (exporters — ours,
    ``rollout_prometheus``, included —, protocol, resource, sampler, id generator, batch and
    export intervals) and every installed instrumentor is applied, minus
    ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``. Does nothing if the SDK is already set up (the
    process inherited ``opentelemetry-instrument``'s start-up hook). Returns whether it configured.
    """
    if sdk_configured():
        return False
    from opentelemetry.instrumentation.auto_instrumentation import initialize

    initialize()
    if not sdk_configured():
        PROCESS.warn(
            "no configurator",
            "otel_rollout: no OpenTelemetry SDK configurator is installed in this "
            "process, so nothing is exported from it; install otel-rollout[otlp] "
            "(it brings opentelemetry-distro)",
        )
        return False
    return True


def force_flush(timeout_s: float = 30.0) -> bool:
    """Export the spans and metric points this process still holds; ``True`` if all went out.

    The SDK batches spans and exports metrics periodically; a process that is killed (a Ray actor
    at ``ray.kill``/``ray.shutdown()``) loses whatever was still buffered, atexit handlers included.
    Request records still queued in otel_rollout's background emitter are emitted first (a
    provider's own ``force_flush`` cannot see them), all within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    ok = emitter.flush_all(timeout_s)
    millis = max(0, int((deadline - time.monotonic()) * 1000))
    providers: tuple[Any, ...] = (trace.get_tracer_provider(), metrics.get_meter_provider())
    for provider in providers:
        flush = getattr(provider, "force_flush", None)
        if flush is None:
            continue
        try:
            result = flush(millis)
        except Exception:
            _logger.warning("otel_rollout: force_flush failed", exc_info=True)
            ok = False
            continue
        ok = ok and result is not False
    return ok
