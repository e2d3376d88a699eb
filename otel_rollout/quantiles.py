"""The one quantile rule of the step figures, shared by the step's analyses."""

from __future__ import annotations

import math
from collections.abc import Sequence


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: a value that really occurred, so it can be traced to a request."""
    index = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[index]


def tail_start_index(n: int, q: float) -> int:
    """Index, in finish order, of the request whose finish starts a step's tail: the one that
    brought the finished share to ``q`` (``OTEL_ROLLOUT_TAIL_QUANTILE``). The step's analytics
    and its span sampling both use it, so the tail a summary names is the tail whose spans are
    kept."""
    return max(0, math.ceil(q * n) - 1)


def tail_size(n: int, q: float) -> int:
    """How many of ``n`` finished requests are a step's tail: those after :func:`tail_start_index`
    (fewer in the analytics where another request finished at the same nanosecond)."""
    return n - 1 - tail_start_index(n, q) if n else 0
