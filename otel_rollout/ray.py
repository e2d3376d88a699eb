"""Rollouts in Ray actors: carry the step's trace context across ``.remote()`` and set up workers.

In verl's layout the driver (trainer) opens ``rollout_step(i)`` and calls rollout actors with
``.remote()``. OpenTelemetry context is process-local, so without help every actor's request spans
start traces of their own and nothing ties them to step ``i``. This module is the help:

* driver: ``carrier = inject_context()`` — W3C ``traceparent`` plus ``baggage`` with
  ``rollout.step``, a small ``dict[str, str]`` that pickles into any ``.remote()`` call;
* actor: ``with continue_context(carrier):`` (or ``@receives_context`` on the actor method) — the
  engine calls inside become descendants of the driver's step span in the same trace, and their
  spans carry ``rollout.step`` from the baggage;
* cluster: ``ray.init(runtime_env=runtime_env())`` — the driver's ``OTEL_*`` / ``OTEL_ROLLOUT_*``
  settings travel to every worker, and :func:`setup_worker` runs in each worker process to set up
  the SDK and the engine instrumentors, as ``opentelemetry-instrument`` does for the driver;
* :func:`force_flush` before an actor goes away, because batched spans die with the process.

Ray itself is not imported here: the helpers only build plain dicts and OTel contexts, so the
module can be imported by the ``worker_process_setup_hook`` cheaply in every worker.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import Token
from typing import Any, TypeVar, cast

from opentelemetry import baggage, metrics, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_rollout import semconv as R
from otel_rollout.ids import UrandomIdGenerator
from otel_rollout.steps import step_number

_logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

CARRIER_KWARG = "otel_context"
"""The keyword argument :func:`receives_context` takes the driver's carrier from."""

SETUP_HOOK = "otel_rollout.ray.setup_worker"
"""Import path of :func:`setup_worker`, as Ray's ``worker_process_setup_hook`` wants it."""

ENV_PREFIXES = ("OTEL_",)
"""Environment variables that configure OpenTelemetry and otel_rollout (``OTEL_ROLLOUT_*``)."""

INSTRUMENT_ENV = "OTEL_ROLLOUT_RAY_INSTRUMENT"
"""Comma-separated engines :func:`setup_worker` instruments (default ``vllm,sglang``; ``none``)."""

_W3C = (TraceContextTextMapPropagator(), W3CBaggagePropagator())
_setup_lock = threading.Lock()
_setup_done = False


# --- context across .remote() ------------------------------------------------------------------

def inject_context(carrier: dict[str, str] | None = None, *, step: int | None = None,
                   context: Context | None = None) -> dict[str, str]:
    """The current trace context (and ``rollout.step`` baggage) as a picklable ``dict``.

    Call it on the driver inside ``rollout_step(i)`` and pass the result to the actor. The
    configured global propagators run first (so B3 or vendor headers a user chose are kept), then
    W3C ``traceparent`` and ``baggage`` are added if those propagators did not write them:
    :func:`continue_context` relies on them, whatever ``OTEL_PROPAGATORS`` says. ``step``
    overrides the step number; by default it is the open step's.
    """
    out: dict[str, str] = {} if carrier is None else carrier
    ctx = context if context is not None else otel_context.get_current()
    number = step if step is not None else step_number(ctx)
    if number is not None:
        ctx = baggage.set_baggage(R.ROLLOUT_STEP, str(number), ctx)
    propagate.inject(out, context=ctx)
    for propagator in _W3C:
        if not set(propagator.fields) & set(out):
            propagator.inject(out, context=ctx)
    return out


def extract_context(carrier: Mapping[str, str] | None) -> Context:
    """The driver's context from a carrier made by :func:`inject_context` (empty if ``None``)."""
    ctx = propagate.extract(carrier or {})
    if carrier:
        if not trace.get_current_span(ctx).get_span_context().is_valid:
            ctx = _W3C[0].extract(carrier, context=ctx)
        if not baggage.get_all(ctx):
            ctx = _W3C[1].extract(carrier, context=ctx)
    return ctx


def continue_context(carrier: Mapping[str, str] | None, *, flush: bool = False) -> ContinuedContext:
    """``with continue_context(carrier):`` in an actor: the driver's step is the parent there.

    Also ``async with`` and a decorator; see :class:`ContinuedContext`.
    """
    return ContinuedContext(carrier, flush=flush)


class ContinuedContext:
    """Attach the driver's context in an actor: ``with``, ``async with`` or a decorator.

    Inside it, spans started in this thread (the instrumentors' batch and request spans) have the
    driver's step span as their parent and ``rollout.step`` reaches them through baggage; the
    actor's own spans would otherwise each start a new trace. With ``flush=True`` the actor's
    spans are exported when the block ends, so the step's trace is complete in the backend by the
    time the driver gets the result back — useful for short jobs and tests, a cost (one blocking
    export) per call otherwise.

    The context is attached to the current thread or task only; work the actor hands to other
    threads must take ``opentelemetry.context.get_current()`` with it, as everywhere in OTel.
    """

    def __init__(self, carrier: Mapping[str, str] | None, *, flush: bool = False) -> None:
        self.carrier = carrier
        self.flush = flush
        self._tokens: list[Token[Context]] = []

    def __enter__(self) -> Context:
        ctx = extract_context(self.carrier)
        self._tokens.append(otel_context.attach(ctx))
        return ctx

    def __exit__(self, *exc: object) -> None:
        otel_context.detach(self._tokens.pop())
        if self.flush:
            force_flush()

    async def __aenter__(self) -> Context:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)

    def __call__(self, func: F) -> F:
        carrier, flush = self.carrier, self.flush
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with ContinuedContext(carrier, flush=flush):
                    return await func(*args, **kwargs)
            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with ContinuedContext(carrier, flush=flush):
                return func(*args, **kwargs)
        return cast(F, wrapper)


def receives_context(func: F | None = None, *, kwarg: str = CARRIER_KWARG,
                     flush: bool = False) -> Any:
    """Decorate an actor method so callers can pass ``otel_context=inject_context()``.

    The carrier is popped from the keyword arguments (the method never sees it) and the method
    runs inside :func:`continue_context`; called without it, the method runs unchanged. This
    keeps tracing out of the rollout method's signature — the layout verl's workers use, where
    the same method is called from the trainer and from tests.
    """

    def decorate(method: F) -> F:
        if inspect.iscoroutinefunction(method):
            @functools.wraps(method)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                carrier = kwargs.pop(kwarg, None)
                async with continue_context(carrier, flush=flush):
                    return await method(*args, **kwargs)
            return _with_carrier_parameter(async_wrapper, method, kwarg)

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            carrier = kwargs.pop(kwarg, None)
            with continue_context(carrier, flush=flush):
                return method(*args, **kwargs)
        return _with_carrier_parameter(wrapper, method, kwarg)

    return decorate(func) if func is not None else decorate


def _with_carrier_parameter(wrapper: Callable[..., Any], method: Callable[..., Any],
                            kwarg: str) -> Any:
    """Advertise the carrier keyword in the wrapper's signature.

    Ray checks ``.remote()`` arguments against the method's signature on the caller's side,
    before anything runs in the actor; without the extra parameter it rejects ``otel_context=``.
    Ray reads that signature after ``inspect.unwrap``, so ``__wrapped__`` (set by
    ``functools.wraps``) is dropped: it would lead Ray past this signature to the original one.
    """
    signature = inspect.signature(method)
    params = list(signature.parameters.values())
    if kwarg not in signature.parameters:
        extra = inspect.Parameter(kwarg, inspect.Parameter.KEYWORD_ONLY, default=None,
                                  annotation="Mapping[str, str] | None")
        var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
        params = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD] + [extra] + var_kw
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    del wrapper.__wrapped__  # type: ignore[attr-defined]
    return wrapper


# --- worker set-up -------------------------------------------------------------------------------

def runtime_env(base: Mapping[str, Any] | None = None, *, env_vars: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None, setup_hook: bool = True) -> dict[str, Any]:
    """A Ray ``runtime_env`` that gives every worker the driver's telemetry configuration.

    ``env_vars`` gets every ``OTEL_*`` variable of the driver (endpoint, protocol, headers,
    service name, resource attributes, sampler, ``OTEL_ROLLOUT_*``), so workers on other nodes —
    which do not inherit the driver's environment — export to the same place with the same
    settings; ``worker_process_setup_hook`` runs :func:`setup_worker` in each worker before any
    task or actor, as ``opentelemetry-instrument`` would for a plain script.

    ``base`` is a runtime_env of your own (verl's, say); its ``env_vars`` win over the driver's
    ``OTEL_*`` values, and ``env_vars=`` here win over both. Pass the result to
    ``ray.init(runtime_env=...)``: Ray honours ``worker_process_setup_hook`` only at job level
    (an actor's ``.options(runtime_env=...)`` applies its ``env_vars`` but ignores the hook), so
    actors configured per actor should call :func:`setup_worker` in ``__init__``; it is
    idempotent.
    """
    source = os.environ if environ is None else environ
    merged: dict[str, Any] = dict(base or {})
    values = {k: v for k, v in source.items() if k.startswith(ENV_PREFIXES)}
    values.update(dict(merged.get("env_vars") or {}))
    values.update(dict(env_vars or {}))
    merged["env_vars"] = values
    if setup_hook:
        existing = merged.get("worker_process_setup_hook")
        if existing not in (None, SETUP_HOOK):
            raise ValueError(
                f"runtime_env already has worker_process_setup_hook={existing!r}; Ray runs only "
                f"one. Call otel_rollout.ray.setup_worker() from that hook instead.")
        merged["worker_process_setup_hook"] = SETUP_HOOK
    return merged


def setup_worker(engines: Sequence[str] | None = None) -> None:
    """Set up OpenTelemetry in a Ray worker from its environment; safe to call more than once.

    What ``opentelemetry-instrument`` does for the driver, done for a worker process Ray started:

    1. unless a global SDK ``TracerProvider`` is already installed (e.g. the driver ran under
       ``opentelemetry-instrument`` and the worker inherited its ``PYTHONPATH`` hook), install
       tracer and meter providers whose exporters follow ``OTEL_TRACES_EXPORTER`` /
       ``OTEL_METRICS_EXPORTER`` (``otlp``, ``console``, ``none``; default ``otlp`` when an OTLP
       endpoint is configured — what ``opentelemetry-distro`` defaults to — else none) and
       ``OTEL_EXPORTER_OTLP_*PROTOCOL`` (``grpc`` or ``http/protobuf``); the SDK reads the
       sampler, resource, batch and export-interval variables itself;
    2. instrument the engines (``OTEL_ROLLOUT_RAY_INSTRUMENT``, default ``vllm,sglang``): at
       once if the engine is already imported, otherwise when the worker first imports it.
       Deferring matters: most Ray workers never touch the engine, and importing vLLM costs
       seconds per process.

    Failures are logged, never raised: a worker must not die because telemetry could not start.
    """
    global _setup_done
    with _setup_lock:
        if _setup_done:
            return
        _setup_done = True
    try:
        configure_sdk()
    except Exception:
        _logger.warning("otel_rollout: could not set up OpenTelemetry in this Ray worker; "
                        "its spans and metrics are not exported", exc_info=True)
    names = engines
    if names is None:
        raw = os.environ.get(INSTRUMENT_ENV, "vllm,sglang")
        names = [] if raw.strip().lower() == "none" else [n.strip() for n in raw.split(",") if n.strip()]
    for name in names:
        _instrument_when_imported(name)


def _exporter_names(signal: str) -> list[str]:
    raw = os.environ.get(f"OTEL_{signal.upper()}_EXPORTER")
    if raw is None or not raw.strip():
        endpoint = (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                    or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"))
        return ["otlp"] if endpoint else []
    return [n.strip().lower() for n in raw.split(",") if n.strip() and n.strip().lower() != "none"]


def _protocol(signal: str) -> str:
    return (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()


def _span_exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp" and _protocol("traces").startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc()
    _logger.warning("otel_rollout: OTEL_TRACES_EXPORTER=%s is not supported in Ray workers "
                    "(otlp, console, none)", name)
    return None


def _metric_exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter()
    if name == "otlp" and _protocol("metrics").startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as Grpc,
        )

        return Grpc()
    _logger.warning("otel_rollout: OTEL_METRICS_EXPORTER=%s is not supported in Ray workers "
                    "(otlp, console, none)", name)
    return None


def configure_sdk() -> None:
    """Install SDK tracer/meter providers exporting per the ``OTEL_*`` environment, if none is set.

    Step 1 of :func:`setup_worker`, usable in any process: ``opentelemetry-instrument`` only
    configures exporters when ``opentelemetry-distro`` (or another configurator) is installed,
    and silently exports nothing otherwise.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"process.pid": os.getpid()})
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        tracer_provider = TracerProvider(resource=resource, id_generator=UrandomIdGenerator())
        for name in _exporter_names("traces"):
            if (span_exporter := _span_exporter(name)) is not None:
                tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        trace.set_tracer_provider(tracer_provider)
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        readers = [PeriodicExportingMetricReader(exporter) for name in _exporter_names("metrics")
                   if (exporter := _metric_exporter(name)) is not None]
        metrics.set_meter_provider(MeterProvider(metric_readers=readers, resource=resource))


def _instrument_when_imported(name: str) -> None:
    factory = _INSTRUMENTORS.get(name)
    if factory is None:
        _logger.warning("otel_rollout: unknown engine %r in %s (vllm, sglang)", name, INSTRUMENT_ENV)
        return
    if name not in sys.modules and importlib.util.find_spec(name) is None:
        return  # not installed in this worker's environment: nothing to do, nothing to import

    def instrument(_module: object = None) -> None:
        try:
            instrumentor = factory()
            if not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument()
        except Exception:
            _logger.warning("otel_rollout: instrumenting %s in a Ray worker failed", name,
                            exc_info=True)

    if name in sys.modules:
        instrument()
    else:
        import wrapt

        wrapt.register_post_import_hook(instrument, name)


def _vllm_instrumentor() -> Any:
    from otel_rollout.vllm import VLLMInstrumentor

    return VLLMInstrumentor()


def _sglang_instrumentor() -> Any:
    from otel_rollout.sglang import SGLangInstrumentor

    return SGLangInstrumentor()


_INSTRUMENTORS: dict[str, Callable[[], Any]] = {
    "vllm": _vllm_instrumentor,
    "sglang": _sglang_instrumentor,
}


def force_flush(timeout_s: float = 30.0) -> bool:
    """Export the spans and metric points this process still holds; ``True`` if all went out.

    The SDK batches spans and exports metrics periodically; an actor that Ray kills (``ray.kill``,
    ``ray.shutdown()``, the job ending) loses whatever was still buffered, atexit handlers
    included. Call it at the end of an actor's work — e.g. from a ``shutdown()`` method the
    driver calls before dropping the actor — or use ``continue_context(..., flush=True)``.
    """
    millis = int(timeout_s * 1000)
    ok = True
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
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


@contextmanager
def flushing(timeout_s: float = 30.0) -> Iterator[None]:
    """``with flushing():`` around an actor's whole life (e.g. a long-running loop method)."""
    try:
        yield
    finally:
        force_flush(timeout_s)
