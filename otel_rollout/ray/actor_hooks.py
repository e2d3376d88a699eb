"""Hooks on a Ray actor class's own methods, registered by the class's name.

A framework whose class is decorated ``@ray.remote`` where it is defined (slime's
``RolloutManager``) cannot be patched by importing its module: the module's name is bound to
Ray's ``ActorClass``, and Ray ships the user's class to the actor's worker *by value* — the
worker runs the methods it unpickled, never the module's. Patching that class on the driver
before Ray exports it would not help either: the patch would have to pickle.

What does reach every actor method is the wrapper the Ray instrumentor puts around each method
Ray builds (:func:`otel_rollout.ray.instrumentor.class_wrapper`), in the worker as on the driver.
It looks the user's method up when called; this registry lets a framework instrumentor put a
``wrapt``-style wrapper (``wrapper(wrapped, instance, args, kwargs)``) around it there, keyed by
the user class's module and qualified name, which survive pickling. Nothing is imported and no
class is touched: an instrumentor registers in ``instrument()`` and removes in
``uninstrument()``; a process that never runs such an actor pays one dictionary look-up per
actor call it serves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ActorHook", "hook_for", "register", "unregister"]

ActorHook = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
"""``wrapper(wrapped, instance, args, kwargs)``, as ``wrapt`` calls a function wrapper."""

ClassKey = tuple[str, str]
"""The user class's ``__module__`` and ``__qualname__``."""

_hooks: dict[ClassKey, dict[str, ActorHook]] = {}
_lock = threading.Lock()


def register(module: str, qualname: str, method: str, hook: ActorHook) -> None:
    """Run ``hook`` around ``method`` of the actor class ``module.qualname``, in every process
    that serves such an actor, from its next call. A second registration for the same method
    replaces the first (one instrumentor owns a method)."""
    with _lock:
        methods = dict(_hooks.get((module, qualname), {}))
        methods[method] = hook
        _hooks[(module, qualname)] = methods


def unregister(module: str, qualname: str, method: str, hook: ActorHook) -> None:
    """Undo :func:`register` (only the hook it names: a later owner's stays)."""
    with _lock:
        methods = dict(_hooks.get((module, qualname), {}))
        if methods.get(method) is hook:
            del methods[method]
        if methods:
            _hooks[(module, qualname)] = methods
        else:
            _hooks.pop((module, qualname), None)


def hook_for(key: ClassKey, method: str) -> ActorHook | None:
    """The hook registered for ``method`` of the class ``key``, if any (read without the lock:
    the registry's dictionaries are replaced, never changed in place)."""
    methods = _hooks.get(key)
    return None if methods is None else methods.get(method)
