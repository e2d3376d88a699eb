"""OpenTelemetry metric names and units → Prometheus names, as the stock exporter maps them.

Our scrape endpoint stands in for ``opentelemetry-exporter-prometheus`` (which cannot serve
exemplars or native histograms), so a dashboard must find the same series whichever of the two a
job runs, and whether the points came by the Collector: the rules below are the stock exporter's
(``opentelemetry.exporter.prometheus._mapping``, itself copied from the Collector's
``normalize_name.go``), tested against it in ``tests/core/test_exposition_names.py``.
"""

from __future__ import annotations

import re

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9:]+")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9]+")
_ANNOTATION = re.compile(r"{.*}")  # UCUM annotations such as {token}: no Prometheus unit

UNITS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
"""UCUM / SI unit → Prometheus unit word (the OTel ↔ Prometheus compatibility specification)."""

PER_UNITS = {
    "s": "second",
    "m": "minute",
    "h": "hour",
    "d": "day",
    "w": "week",
    "mo": "month",
    "y": "year",
}
"""Denominators of a ratio unit (``By/s`` → ``bytes_per_second``)."""


def _sanitize(name: str) -> str:
    return _INVALID_NAME.sub("_", name)


def prometheus_unit(unit: str) -> str:
    """The unit word a metric name ends with: ``s`` → ``seconds``, ``{token}`` → nothing."""
    unit = _ANNOTATION.sub("", unit)
    if unit in UNITS:
        return UNITS[unit]
    top, slash, bottom = unit.partition("/")
    if slash and _sanitize(bottom):
        top, bottom = _sanitize(top), _sanitize(bottom)
        top = UNITS.get(top, top)
        bottom = PER_UNITS.get(bottom, bottom)
        return f"{top}_per_{bottom}" if top else f"per_{bottom}"
    return _sanitize(unit).strip("_")


def metric_name(name: str, unit: str, counter: bool = False) -> tuple[str, str]:
    """(Prometheus name, unit word): ``a.b`` in ``s`` → ``a_b_seconds``. A counter's name comes
    without ``_total`` (``requests_total`` in ``s`` → ``requests_seconds``): each writer adds it
    last, as ``prometheus_client`` does for the stock exporter."""
    if name[:1].isdigit():
        name = "_" + name[1:]
    base = _sanitize(name)
    if counter:
        base = base.removesuffix("_total")
    suffix = prometheus_unit(unit)
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return base, suffix


def label_name(key: str) -> str:
    """A Prometheus label name for an attribute key: ``gen_ai.request.model`` →
    ``gen_ai_request_model``."""
    if key[:1].isdigit():
        key = "_" + key[1:]
    return _INVALID_LABEL.sub("_", key)
