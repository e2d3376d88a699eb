"""Every place otel_rollout reaches past the OpenTelemetry SDK's public API, in one module.

The SDK offers no public hook for four things we need, so each is done here and nowhere else
(the architecture test refuses an SDK private anywhere else in the package), with a test per
private in ``tests/core/test_sdk_internals.py`` that runs on every SDK version we declare
(``opentelemetry-sdk>=1.37``). On an SDK upgrade, that test is the one to read first.

* **Exit handler** (``TracerProvider`` / ``MeterProvider._atexit_handler``, ``._shutdown``): the
  bounded exit replaces the provider's unbounded shutdown at exit (:func:`otel_rollout.sdk.
  bound_exit`); the SDK keeps the handle in ``_atexit_handler`` and unregisters it the same way.
* **Aggregation per instrument** (``Aggregation._create_aggregation`` and its reservoir factory
  protocol): a reader's ``preferred_aggregation`` applies to every histogram; choosing
  exponential for our long-tail instruments only, with an exemplar reservoir aligned on the
  classic buckets, needs the method views call (:mod:`otel_rollout.histograms`).
* **Preset span ids** (a copy of an SDK ``Tracer`` with its own ``id_generator``): ids are drawn
  in the caller when a record is handed over, the span is made later on the emitter thread.
* **Provider flush** (``force_flush`` / ``shutdown`` of the SDK providers, wrapped): no public hook
  runs before a provider's flush, and our queued records must be emitted before it.
"""

from __future__ import annotations

import atexit
import copy
from collections.abc import Callable, Sequence
from typing import Any

import wrapt
from opentelemetry.sdk.metrics import AlignedHistogramBucketExemplarReservoir
from opentelemetry.sdk.metrics.view import Aggregation
from opentelemetry.trace import Tracer

from otel_rollout.ids import PresetIds

# --- exit handler --------------------------------------------------------------------------------


def owns_exit_handler(provider: object) -> bool:
    """An SDK provider (it registers its own shutdown at exit) that is not shut down yet."""
    return (
        callable(getattr(provider, "shutdown", None))
        and hasattr(provider, "_atexit_handler")
        and getattr(provider, "_shutdown", False) is not True
    )


def unregister_exit_handler(provider: Any) -> bool:
    """Take the provider's own shutdown off ``atexit``; returns whether one was registered."""
    handler = getattr(provider, "_atexit_handler", None)
    if handler is None:
        return False
    atexit.unregister(handler)
    provider._atexit_handler = None
    return True


# --- aggregation per instrument ------------------------------------------------------------------

ReservoirFactory = Callable[[type], Callable[..., Any]]
"""What the SDK passes ``_create_aggregation``: aggregation type → exemplar reservoir builder."""


class ChoosingAggregation(Aggregation):
    """An ``Aggregation`` that picks another aggregation per instrument.

    Subclasses implement :meth:`choose`; the SDK's views and readers call ``_create_aggregation``,
    which delegates to the chosen one (and to :meth:`fallback` if the chosen one fails to build:
    an SDK whose internals moved keeps explicit buckets working).
    """

    def choose(self, instrument: Any) -> tuple[Aggregation, ReservoirFactory | None]:
        """(aggregation, reservoir factory or ``None`` for the SDK's) for this instrument."""
        raise NotImplementedError

    def fallback(self, instrument: Any, chosen: Aggregation, error: Exception) -> Aggregation:
        """The aggregation to use when ``chosen`` raised ``error``; re-raise to give up."""
        raise error

    def _create_aggregation(
        self,
        instrument: Any,
        attributes: Any,
        reservoir_factory: ReservoirFactory,
        start_time_unix_nano: int,
    ) -> Any:
        chosen, reservoir = self.choose(instrument)
        try:
            return chosen._create_aggregation(
                instrument, attributes, reservoir or reservoir_factory, start_time_unix_nano
            )
        except Exception as exc:
            return self.fallback(instrument, chosen, exc)._create_aggregation(
                instrument, attributes, reservoir_factory, start_time_unix_nano
            )


def aligned_reservoir(bounds: Sequence[float]) -> ReservoirFactory:
    """A reservoir factory keeping one exemplar per classic bucket (the latest)."""
    boundaries = list(bounds)

    def builder(**_ignored: Any) -> AlignedHistogramBucketExemplarReservoir:
        # the exponential aggregation passes size=...; an aligned reservoir sizes itself
        return AlignedHistogramBucketExemplarReservoir(boundaries=boundaries)

    return lambda _aggregation_type: builder


# --- preset span ids -----------------------------------------------------------------------------


def preset_tracer(tracer: Tracer) -> tuple[Tracer, PresetIds | None]:
    """A copy of an SDK tracer (same provider, scope, processors) whose ids can be preset."""
    inner = getattr(tracer, "id_generator", None)
    if inner is None or not callable(getattr(inner, "generate_span_id", None)):
        return tracer, None  # not an SDK tracer (no-op, proxy): ids are set at emission
    clone = copy.copy(tracer)
    preset = PresetIds(inner)
    clone.id_generator = preset  # type: ignore[attr-defined]
    return clone, preset


# --- provider flush ------------------------------------------------------------------------------


def wrap_provider_flushes(wrapper: Callable[..., Any]) -> None:
    """Wrap ``force_flush`` and ``shutdown`` of the SDK's ``TracerProvider`` and ``MeterProvider``
    (``wrapt`` signature: ``wrapper(wrapped, instance, args, kwargs)``)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    for owner in (TracerProvider, MeterProvider):
        for method in ("force_flush", "shutdown"):
            wrapt.wrap_function_wrapper(owner, method, wrapper)
