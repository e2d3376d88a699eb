"""A bounded exit: exporters' retries must not hold a training job after its last line.

The SDK shuts its providers down at exit and waits for the exporters; an OTLP exporter facing an
unreachable or slow collector retries each signal's final export for up to
``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s by default) — measured here at +28 s (refused port) to +40 s
(black hole) on a vLLM run's exit. Once an instrumentor is active we take over that shutdown: it
runs in a daemon thread, and the process waits at most ``OTEL_ROLLOUT_EXIT_TIMEOUT`` for it.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
from opentelemetry import metrics, trace

_logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def bound_exit(timeout_s: float) -> None:
    """Register (once per process) the bounded shutdown of the global providers at exit."""
    atexit.register(_shutdown_within, timeout_s)


def _shutdown_within(timeout_s: float) -> None:
    providers = [p for p in (trace.get_tracer_provider(), metrics.get_meter_provider())
                 if callable(getattr(p, "shutdown", None)) and hasattr(p, "_atexit_handler")
                 and getattr(p, "_shutdown", False) is not True]  # already shut down by its owner
    if not providers:
        return
    for provider in providers:
        # The SDK registered its own unbounded shutdown at exit; ours replaces it. The SDK keeps
        # the handle in this attribute and unregisters it the same way in its shutdown().
        handler = provider._atexit_handler
        if handler is not None:
            atexit.unregister(handler)
            provider._atexit_handler = None

    def work() -> None:
        for provider in providers:
            try:
                provider.shutdown()
            except Exception:  # exit must go on whatever the exporter does
                _logger.debug("otel_rollout: provider shutdown failed at exit", exc_info=True)

    worker = threading.Thread(target=work, name="otel_rollout-exit", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        _logger.warning("otel_rollout: telemetry export did not finish within %.1f s of exit "
                        "(OTEL_ROLLOUT_EXIT_TIMEOUT); the rest is dropped so the process can end",
                        timeout_s)
