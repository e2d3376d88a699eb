"""The one quantile rule of the step figures, shared by the step's analyses."""

from __future__ import annotations

import math
from collections.abc import Sequence


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: a value that really occurred, so it can be traced to a request."""
    index = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[index]
