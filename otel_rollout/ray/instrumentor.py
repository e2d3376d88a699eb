"""``RayInstrumentor``: trace context and the step cross ``.remote()`` calls with no code change.

Ray already gives every actor method a hidden keyword parameter, ``_ray_trace_ctx``: its
``_inject_tracing_into_class`` adds it to each method's signature whether or not Ray's own (alpha,
unmaintained) tracing is on, and drops the value when it is off. We use that channel rather than
inventing one:

* caller side (``ActorHandle._actor_method_call``, where every ``actor.method.remote()`` ends up,
  after Ray's own checks): when the caller is inside a span or a step and Ray's tracing is off,
  the W3C context (``traceparent`` + ``baggage`` with ``rollout.step``) goes into
  ``_ray_trace_ctx``; with Ray's tracing on, Ray injects it itself and we only add the call's id
  (for step accounting) to Ray's dict — one propagation, never two;
* callee side (the two places Ray builds an actor class, driver and worker): each method Ray
  wrapped is wrapped once more to take ``_ray_trace_ctx`` first, attach that context around the
  method (sync and async methods; any depth, since the callee is a caller in turn) and report the
  step's records back (:mod:`otel_rollout.ray.steps`). Ray's own consumer span is then not made;
  its producer span, if Ray tracing is on, stays the parent;
* ``ray.init``: the job's ``runtime_env`` gets the driver's ``OTEL_*`` settings and the worker
  set-up hook (:func:`otel_rollout.ray.setup_worker`), so workers on every node are configured and
  instrumented as the driver is.

Tasks (``@ray.remote`` functions) get the same parameter from us: Ray gives a task one only when
its tracing is on, in ``_inject_tracing_into_function``, called once per function before it is
exported. Wrapping that call, the function Ray exports takes ``_ray_trace_ctx`` (a parameter of
our own in its signature) and continues the caller's context and step as actor methods do; on
the caller's side the carrier is added where Ray flattens a call's arguments against that
signature (``ray._common.signature.flatten_args``), recognised by our parameter object, so actor
calls and Ray's own tasks are left alone. Generator and ``async`` functions are left to Ray.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context

from otel_rollout.context import current_step
from otel_rollout.guard import LogOnce
from otel_rollout.instrumentation import LibraryInstrumentor, Target, argument
from otel_rollout.propagation import inject_context
from otel_rollout.ray import actor_hooks
from otel_rollout.ray.steps import (
    CALL_ID,
    RayStepChannel,
    call_started,
    remote_call,
    step_key,
)
from otel_rollout.steps import register_channel, unregister_channel

__all__ = ["RayInstrumentor"]

CTX_KWARG = "_ray_trace_ctx"
_MARK = "__otel_rollout_wrapped__"
_log = LogOnce()


def _worth_propagating() -> bool:
    """Only calls made inside a span or a step carry a context; Ray's own calls stay untouched."""
    return (
        trace.get_current_span().get_span_context().is_valid
        or current_step() is not None
        or step_key() is not None
    )


_last_carrier: tuple[weakref.ref[Context], dict[str, str]] | None = None


def _carrier() -> dict[str, str]:
    """:func:`inject_context` of the current context, made once per context: a step's thousands
    of calls from one worker are made in one context, and the carrier is a function of it. A
    copy each call: the call's own id is added to it."""
    global _last_carrier
    ctx = otel_context.get_current()
    cached = _last_carrier
    if cached is None or cached[0]() is not ctx:
        cached = _last_carrier = (weakref.ref(ctx), inject_context(context=ctx))
    return dict(cached[1])


def actor_call_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``ActorHandle._actor_method_call(method_name, args, kwargs, ...)``: add the context."""
    with _log.guard("ray actor call"):
        args, kwargs = _with_context(instance, args, kwargs)
    return wrapped(*args, **kwargs)


def _with_context(
    handle: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not _worth_propagating() or getattr(handle, "_ray_is_cross_language", False):
        return args, kwargs
    method = argument(args, kwargs, 0, "method_name")
    signature = getattr(handle, "_ray_method_signatures", {}).get(method) or ()
    if not any(getattr(p, "name", None) == CTX_KWARG for p in signature):
        return args, kwargs  # a method Ray gave no context parameter (generators, Ray's own)
    call_id = call_started()
    positional = len(args) > 2
    call_kwargs = dict((args[2] if positional else kwargs.get("kwargs")) or {})
    carrier = call_kwargs.get(CTX_KWARG)
    if carrier is None:
        carrier = _carrier()  # Ray's tracing is off; with it on, Ray injected its own
    elif call_id is not None:
        carrier = dict(carrier)
    if call_id is not None:
        carrier[CALL_ID] = call_id
    call_kwargs[CTX_KWARG] = carrier
    if positional:
        return (*args[:2], call_kwargs, *args[3:]), kwargs
    return args, {**kwargs, "kwargs": call_kwargs}


def class_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``_inject_tracing_into_class(cls)``: after Ray, make each traced method continue the caller."""
    result = wrapped(*args, **kwargs)
    with _log.guard("ray actor class"):
        cls = argument(args, kwargs, 0, "_cls")
        for name, method in inspect.getmembers(cls, inspect.isfunction):
            if getattr(method, "__ray_tracing_wrapped__", False) and not getattr(
                method, _MARK, False
            ):
                setattr(cls, name, _continuing(method, _late_bound(cls, name)))
    return result


def _late_bound(cls: type, name: str) -> Callable[[Any], Callable[..., Any]] | None:
    """The user's method ``name`` of the actor, looked up on each call, not captured.

    Ray ships the actor class from the driver *by value*, with a wrapper of its own around each
    method that holds the driver's function: a method some instrumentor patched in the worker
    (verl's ``AgentLoopWorker._run_agent_loop``, say) would never run there. Looking the
    method up on the user's class (``__ray_actor_class__``, which travels by reference) when
    called runs what the worker's module holds now — patched or not. Ray's own wrapper is only
    skipped where it is a pass-through: we never hand it a trace context. Ray's own methods
    (``__ray_ready__`` …) are not on the user's class and keep their captured function.
    """
    base = getattr(cls, "__ray_actor_class__", None)
    if not isinstance(base, type) or not callable(inspect.getattr_static(base, name, None)):
        return None
    return functools.partial(_user_method, cls, name, (base.__module__, base.__qualname__))


def _user_method(cls: type, name: str, key: actor_hooks.ClassKey, self: Any) -> Callable[..., Any]:
    """The user's method ``name`` bound to ``self``, inside the hook a framework instrumentor
    registered for it (:mod:`otel_rollout.ray.actor_hooks`), if any. Module-level, so the
    driver's pickled class calls the worker's copy of this function and sees its registry."""
    method: Callable[..., Any] = getattr(super(cls, self), name)
    hook = actor_hooks.hook_for(key, name)
    if hook is None:
        return method
    return lambda *args, **kwargs: hook(method, self, args, kwargs)


def _continuing(
    method: Callable[..., Any], late: Callable[[Any], Callable[..., Any]] | None = None
) -> Callable[..., Any]:
    def bound(self: Any) -> Callable[..., Any]:
        return late(self) if late is not None else functools.partial(method, self)

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def async_call(
            self: Any, *args: Any, _ray_trace_ctx: Any = None, **kwargs: Any
        ) -> Any:
            if not _ray_trace_ctx:
                return await bound(self)(*args, **kwargs)
            with remote_call(_ray_trace_ctx):
                return await bound(self)(*args, **kwargs)

        call: Callable[..., Any] = async_call
    else:

        @functools.wraps(method)
        def sync_call(self: Any, *args: Any, _ray_trace_ctx: Any = None, **kwargs: Any) -> Any:
            if not _ray_trace_ctx:
                return bound(self)(*args, **kwargs)
            with remote_call(_ray_trace_ctx):
                return bound(self)(*args, **kwargs)

        call = sync_call
    setattr(call, _MARK, True)
    return call


class _ContextParameter(inspect.Parameter):
    """The context parameter of a task we wrapped, told apart from Ray's own by its type (which
    survives pickling: a task function passed to a worker is still recognised there)."""

    __slots__ = ()


_SIGNATURE = "__signature__"


def function_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``_inject_tracing_into_function(fn)`` (Ray's, once per task function): after Ray, make the
    function take ``_ray_trace_ctx`` and continue the caller, whether Ray's tracing is on or off."""
    result = wrapped(*args, **kwargs)
    with _log.guard("ray task function"):
        return _continuing_task(result)
    return result


def _continuing_task(function: Callable[..., Any]) -> Callable[..., Any]:
    if (
        getattr(function, _MARK, False)
        or inspect.isgeneratorfunction(function)
        or inspect.iscoroutinefunction(function)
        or inspect.isasyncgenfunction(function)
    ):
        return function
    signature = inspect.signature(function)
    params = [p for p in signature.parameters.values() if p.name != CTX_KWARG]
    at = next(
        (i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params)
    )
    params.insert(at, _ContextParameter(CTX_KWARG, inspect.Parameter.KEYWORD_ONLY, default=None))

    @functools.wraps(function)
    def task_call(*args: Any, _ray_trace_ctx: Any = None, **kwargs: Any) -> Any:
        if not _ray_trace_ctx:
            return function(*args, **kwargs)
        with remote_call(_ray_trace_ctx):
            return function(*args, **kwargs)

    setattr(task_call, _SIGNATURE, signature.replace(parameters=params))
    setattr(task_call, _MARK, True)
    return task_call


def task_args_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``flatten_args(signature, args, kwargs)``: a call of a task we wrapped gets the carrier."""
    with _log.guard("ray task call"):
        args = _task_with_context(args)
    return wrapped(*args, **kwargs)


def _task_with_context(args: tuple[Any, ...]) -> tuple[Any, ...]:
    if len(args) != 3:
        return args
    signature, call_args, call_kwargs = args
    if not any(isinstance(p, _ContextParameter) for p in signature or ()):
        return args
    if not _worth_propagating():
        return args
    call_kwargs = dict(call_kwargs or {})
    carrier = call_kwargs.get(CTX_KWARG)
    carrier = _carrier() if carrier is None else dict(carrier)
    call_id = call_started()
    if call_id is not None:
        carrier[CALL_ID] = call_id
    call_kwargs[CTX_KWARG] = carrier
    return signature, call_args, call_kwargs


def init_wrapper(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``ray.init``: give the job's workers the driver's telemetry settings and set-up hook.

    The job's step collector is not started here but at its first step: it is a worker process
    of its own (seconds on a busy node), and a Ray job that never opens a step must not pay for
    it — measured, starting it here doubled ``ray.init`` + one task on this 2-core machine
    (``tests/e2e/test_startup.py``). Started with the first step, its start overlaps that step's
    requests; the step's end waits for it (``COLLECTOR_START_S``).
    """
    with _log.guard("ray.init runtime_env"):
        kwargs = {**kwargs, "runtime_env": _job_runtime_env(kwargs.get("runtime_env"))}
    return wrapped(*args, **kwargs)


def _job_runtime_env(given: Any) -> Any:
    from otel_rollout.ray import RESOURCE_DETECTORS, SETUP_HOOK, WORKER_DETECTORS, runtime_env

    base = dict(given or {})
    hook = base.get("worker_process_setup_hook")
    if hook not in (None, SETUP_HOOK):
        _log.warn(
            "ray setup hook",
            "otel_rollout: the job's runtime_env already has "
            "worker_process_setup_hook=%r; workers are not set up by otel_rollout (call "
            "otel_rollout.ray.setup_worker() from that hook)",
            hook,
        )
        return given
    env = runtime_env(base)
    # Workers that inherit opentelemetry-instrument's start-up hook configure the SDK before our
    # set-up hook runs; the detectors that tell them apart must already be in their environment.
    env["env_vars"].setdefault(RESOURCE_DETECTORS, WORKER_DETECTORS)
    return env


class RayInstrumentor(LibraryInstrumentor):
    """Zero-code Ray: context and steps across actor calls, workers set up like the driver."""

    engine_module = "ray"
    engine_name = "Ray"
    min_version = (2, 9)
    max_tested = (2, 60, 0)

    def _targets(self) -> list[Target]:
        return [
            Target("ray.actor", "ActorHandle._actor_method_call", actor_call_wrapper),
            Target("ray.actor", "_inject_tracing_into_class", class_wrapper),
            Target("ray._private.function_manager", "_inject_tracing_into_class", class_wrapper),
            Target("ray.remote_function", "_inject_tracing_into_function", function_wrapper),
            Target("ray._common.signature", "flatten_args", task_args_wrapper),
            Target("ray", "init", init_wrapper),
        ]

    def _prepare(self, **kwargs: Any) -> LogOnce:
        self._channel = RayStepChannel()
        register_channel(self._channel)
        return _log

    def _uninstrument(self, **kwargs: Any) -> None:
        super()._uninstrument(**kwargs)
        unregister_channel(self._channel)
