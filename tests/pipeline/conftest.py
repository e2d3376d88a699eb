"""Fixtures for the static pipeline tests (collector, Prometheus, Tempo, Grafana, compose).

These tests need no running service: they check the committed configs structurally and with
the real tools that can run here (promtool; node with @grafana/lezer-traceql).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return HERE.parent.parent
