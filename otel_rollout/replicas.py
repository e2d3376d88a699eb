"""Which replica served a request: a name for the engine instance, so a step knows who did what.

A step spread over several engines ends when the busiest one ends; to say so (the
``replica_imbalance`` cause, the balanced what-if: :mod:`otel_rollout.attribution`,
:mod:`otel_rollout.whatif`) every request record carries the replica that served it, named
where the record is made and carried with it (pickled across Ray with the record):

* an engine in this process: the Ray actor's name where the process is a named actor (verl's
  and slime's servers are), else ``host:pid``; a second engine object in the same process gets
  ``#1`` after it, a third ``#2`` — in the order they served their first request;
* a request an HTTP client sent (``rollout.timing.source = client``): the server's
  ``host:port``, the replica as the client knows it (behind a router, the router).

The names are bounded by the deployment (one per engine), never by requests: they go on spans
and into step analysis, not onto metric labels.
"""

from __future__ import annotations

import itertools
import os
import socket
import sys
import threading
import weakref
from typing import Any
from urllib.parse import urlsplit

__all__ = ["endpoint_replica", "engine_replica", "process_replica"]

_process: tuple[int, str] | None = None
_engines: dict[int, tuple[weakref.ref[Any] | None, int, str]] = {}
"""``id(engine)`` → (a weak reference to it, or ``None`` where it takes none; the pid the name
was made in; its name). Asked once per request: a dict lookup and two checks, no weak
reference made per call (``WeakKeyDictionary.get`` makes one)."""
_numbers = itertools.count()
_lock = threading.Lock()


def process_replica() -> str:
    """This process as a replica: its Ray actor's name, else ``host:pid`` (asked again after a
    fork: the child is another replica)."""
    global _process
    pid = os.getpid()
    known = _process
    if known is not None and known[0] == pid:
        return known[1]
    name = _actor_name() or f"{socket.gethostname()}:{pid}"
    _process = (pid, name)
    return name


def _actor_name() -> str | None:
    """The named Ray actor this process runs, if any; Ray is never imported for it."""
    ray = sys.modules.get("ray")
    if ray is None or not getattr(ray, "is_initialized", lambda: False)():
        return None
    try:
        name = ray.get_runtime_context().get_actor_name()
    except Exception:  # not an actor, or a Ray without the call
        return None
    return str(name) if name else None


def engine_replica(engine: object) -> str:
    """The replica of one engine object in this process: :func:`process_replica`, with ``#k``
    for the k-th other engine object that served a request here."""
    known = _engines.get(id(engine))
    if known is not None and known[1] == os.getpid() and (known[0] is None or known[0]() is engine):
        return known[2]
    with _lock:
        number = next(_numbers)
        name = process_replica() + (f"#{number}" if number else "")
        try:
            ref: weakref.ref[Any] | None = weakref.ref(engine, _forget(id(engine)))
        except TypeError:  # not weak-referenceable: kept by id for the process's life
            ref = None
        _engines[id(engine)] = (ref, os.getpid(), name)
    return name


def _forget(key: int) -> Any:
    def forget(_: object) -> None:
        known = _engines.get(key)
        if known is not None and known[0] is not None and known[0]() is None:
            del _engines[key]

    return forget


def endpoint_replica(url: object) -> str | None:
    """A server's ``host:port`` from a request URL (an ``httpx.URL`` or a string)."""
    netloc = getattr(url, "netloc", None)
    if isinstance(netloc, bytes):
        netloc = netloc.decode("ascii", "replace")
    if not netloc:
        netloc = urlsplit(str(url)).netloc
    return str(netloc) or None
