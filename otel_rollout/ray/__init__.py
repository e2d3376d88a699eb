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
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import Token
from typing import Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from otel_rollout.propagation import extract_context, inject_context

__all__ = [
    "SETUP_HOOK",
    "continue_context",
    "extract_context",
    "flushing",
    "force_flush",
    "inject_context",
    "receives_context",
    "runtime_env",
    "setup_worker",
]
from otel_rollout.sdk import configure_from_environment, force_flush

_logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

CARRIER_KWARG = "otel_context"
"""The keyword argument :func:`receives_context` takes the driver's carrier from."""

SETUP_HOOK = "otel_rollout.ray.setup_worker"
"""Import path of :func:`setup_worker`, as Ray's ``worker_process_setup_hook`` wants it."""

ENV_PREFIXES = ("OTEL_",)
"""Environment variables that configure OpenTelemetry and otel_rollout (``OTEL_ROLLOUT_*``)."""

_setup_lock = threading.Lock()
_setup_done = False


# --- context across .remote() ------------------------------------------------------------------


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


def receives_context(
    func: F | None = None, *, kwarg: str = CARRIER_KWARG, flush: bool = False
) -> Any:
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

            return cast(F, _with_carrier_parameter(async_wrapper, method, kwarg))

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            carrier = kwargs.pop(kwarg, None)
            with continue_context(carrier, flush=flush):
                return method(*args, **kwargs)

        return cast(F, _with_carrier_parameter(wrapper, method, kwarg))

    return decorate(func) if func is not None else decorate


def _with_carrier_parameter(
    wrapper: Callable[..., Any], method: Callable[..., Any], kwarg: str
) -> Any:
    """Advertise the carrier keyword in the wrapper's signature.

    Ray checks ``.remote()`` arguments against the method's signature on the caller's side,
    before anything runs in the actor; without the extra parameter it rejects ``otel_context=``.
    Ray reads that signature after ``inspect.unwrap``, so ``__wrapped__`` (set by
    ``functools.wraps``) is dropped: it would lead Ray past this signature to the original one.
    """
    signature = inspect.signature(method)
    params = list(signature.parameters.values())
    if kwarg not in signature.parameters:
        extra = inspect.Parameter(
            kwarg,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation="Mapping[str, str] | None",
        )
        var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
        params = (
            [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD] + [extra] + var_kw
        )
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    del wrapper.__wrapped__  # type: ignore[attr-defined]
    return wrapper


# --- worker set-up -------------------------------------------------------------------------------


def runtime_env(
    base: Mapping[str, Any] | None = None,
    *,
    env_vars: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    setup_hook: bool = True,
) -> dict[str, Any]:
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
    if RESOURCE_ATTRIBUTES in values:
        values[RESOURCE_ATTRIBUTES] = _without_instance_id(values[RESOURCE_ATTRIBUTES])
    values.update(dict(merged.get("env_vars") or {}))
    values.update(dict(env_vars or {}))
    merged["env_vars"] = values
    if setup_hook:
        existing = merged.get("worker_process_setup_hook")
        if existing not in (None, SETUP_HOOK):
            raise ValueError(
                f"runtime_env already has worker_process_setup_hook={existing!r}; Ray runs only "
                f"one. Call otel_rollout.ray.setup_worker() from that hook instead."
            )
        merged["worker_process_setup_hook"] = SETUP_HOOK
    return merged


RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
RESOURCE_DETECTORS = "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"
WORKER_DETECTORS = "process,host"
"""What tells one worker from another: pid, host (the SDK adds a fresh ``service.instance.id``)."""


def _without_instance_id(attributes: str) -> str:
    """The driver's resource attributes minus ``service.instance.id``: copied to every worker,
    it would make all their series identical and collide in the Collector's exporter."""
    kept = [
        item
        for item in attributes.split(",")
        if item.split("=", 1)[0].strip() != "service.instance.id"
    ]
    return ",".join(kept)


def setup_worker() -> None:
    """Set up OpenTelemetry in a Ray worker from its environment; safe to call more than once.

    What ``opentelemetry-instrument`` does for the driver, done for a worker process Ray started
    (:func:`otel_rollout.sdk.configure_from_environment`): the distro's configurator installs the
    providers and exporters the ``OTEL_*`` variables ask for, and every installed instrumentor —
    the engines' among them, found through their entry points — is applied, minus
    ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``. Engines are patched only when the worker imports
    them, so workers that never touch an engine pay nothing for it. Nothing happens if the worker
    inherited ``opentelemetry-instrument``'s start-up hook. Failures are logged, never raised: a
    worker must not die because telemetry could not start.
    """
    global _setup_done
    with _setup_lock:
        if _setup_done:
            return
        _setup_done = True
    try:
        os.environ.setdefault(RESOURCE_DETECTORS, WORKER_DETECTORS)
        configure_from_environment()
    except Exception:
        _logger.warning(
            "otel_rollout: could not set up OpenTelemetry in this Ray worker; "
            "its spans and metrics are not exported",
            exc_info=True,
        )


@contextmanager
def flushing(timeout_s: float = 30.0) -> Iterator[None]:
    """``with flushing():`` around an actor's whole life (e.g. a long-running loop method)."""
    try:
        yield
    finally:
        force_flush(timeout_s)
