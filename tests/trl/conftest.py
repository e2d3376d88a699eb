"""Fixtures for TRL's own trainers: one job run per trainer kind, one OTLP receiver for each."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import require_module


@pytest.fixture(scope="module")
def trl_module() -> Any:
    """TRL itself (the trl env: scripts/engine-env trl); skipped elsewhere unless required."""
    return require_module("trl")
