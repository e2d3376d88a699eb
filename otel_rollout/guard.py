"""The one "log once" mechanism: our failures and warnings are said once per site, then stay quiet.

A broken exporter or meter would otherwise log once per request — thousands of lines per training
step — and bury the one message that matters. Every place in the package that swallows a failure
of ours, or warns about a condition that repeats, goes through :class:`LogOnce`.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

_logger = logging.getLogger("otel_rollout")


class Guard:
    """One site's reusable context manager: free on the way through, logs once on failure.

    A class rather than ``@contextmanager``: the guard sits on every request and every streamed
    chunk, and a generator-based context manager costs a generator object and two frames per use.
    """

    __slots__ = ("_owner", "_site")

    def __init__(self, owner: LogOnce, site: str) -> None:
        self._owner = owner
        self._site = site

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc_type is None or not issubclass(exc_type, Exception):
            return False
        self._owner.failed(self._site, exc)
        return True  # our own telemetry failed; the engine's work must not notice


class LogOnce:
    """Remembers which sites have spoken; each says its first failure or warning, then nothing."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._guards: dict[str, Guard] = {}

    def guard(self, site: str) -> Guard:
        guard = self._guards.get(site)
        if guard is None:
            guard = self._guards.setdefault(site, Guard(self, site))
        return guard

    def first(self, site: str) -> bool:
        """True the first time ``site`` is named, False ever after (thread-safe)."""
        with self._lock:
            if site in self._seen:
                return False
            self._seen.add(site)
            return True

    def failed(self, site: str, exc: BaseException | None) -> None:
        if self.first(site):
            _logger.warning(
                "otel_rollout: telemetry failed in %s; the request itself is unaffected. "
                "Further failures here are not logged.",
                site,
                exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None,
            )

    def warn(self, site: str, message: str, *args: object) -> None:
        """Log ``message`` as a warning the first time ``site`` warns."""
        if self.first(site):
            _logger.warning(message, *args)


PROCESS = LogOnce()
"""Warnings about the process as a whole (a missing optional dependency, a replaced provider)."""
