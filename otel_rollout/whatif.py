"""What would have helped a step: estimates from its own timeline, labelled as estimates (#42).

Two changes RL engineers reach for against a long tail, each read off the step's requests:

* **cap** ``max_tokens`` at the step's p95 (p99) output length: a request that decoded more
  tokens than the cap would have ended when it produced the cap's token, at its own pace —
  first token + decode × cap / tokens. The step's generation then ends at the latest of those
  finishes; the seconds saved are the difference, the requests cut how many it truncates.
* **stop** the rollout once 90 % (95 %) of its requests have finished (partial rollout, as
  slime and AReaL offer): generation ends at that finish; the requests still running are lost.

Across replicas (where the step's requests name two or more, :mod:`otel_rollout.replica_load`):
**balanced** work (seconds saved) and the **fewest replicas** that would have ended the step no
later.

The model, written down so its error can be measured: the rest of the step (what ran after
generation) is unchanged, and a capped request reaches the cap at its own average pace. A stop
changes nothing before it: exact but for the abort's cost. Where per-token time grows with the
batch, a long request's early tokens are slower than its average, so a cap's estimate is an
upper bound (measured against real reruns: docs/OUTPUTS.md).
Requests without a first-token stamp (timed by an HTTP client) are paced from their arrival.
Pure: records in, figures out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from otel_rollout.quantiles import nearest_rank, tail_start_index
from otel_rollout.record import RequestRecord
from otel_rollout.replica_load import ReplicaStats

__all__ = [
    "BALANCED",
    "CAP_QUANTILES",
    "STOP_QUANTILES",
    "Balance",
    "Cap",
    "Stop",
    "WhatIf",
    "what_if",
]

CAP_QUANTILES = (0.95, 0.99)
BALANCED = "balanced"
STOP_QUANTILES = (0.9, 0.95)


@dataclass(frozen=True)
class Cap:
    quantile: float
    tokens: int
    """The cap: the step's output length at ``quantile``."""
    saved_s: float
    truncated: int

    @property
    def name(self) -> str:
        return f"cap_p{round(self.quantile * 100)}"


@dataclass(frozen=True)
class Stop:
    quantile: float
    saved_s: float
    lost: int
    """Requests still running when the share had finished."""

    @property
    def name(self) -> str:
        return f"stop_{round(self.quantile * 100)}"


@dataclass(frozen=True)
class Balance:
    replicas: int
    saved_s: float
    """Balanced replicas: seconds sooner the step's generation would have ended."""
    fewest: int
    """The fewest replicas that, balanced, would have ended it no later."""


@dataclass(frozen=True)
class WhatIf:
    caps: tuple[Cap, ...]
    stops: tuple[Stop, ...]
    balance: Balance | None = None
    """Where the step had two replicas or more."""

    def savings(self) -> list[tuple[str, float]]:
        """Each change by its name (``cap_p95``, ``stop_90``, ``balanced``, …) and the seconds
        it would have saved: the names of the span attributes and the metric's label."""
        named = [(c.name, c.saved_s) for c in self.caps] + [(s.name, s.saved_s) for s in self.stops]
        if self.balance is not None:
            named.append((BALANCED, self.balance.saved_s))
        return named


def what_if(
    records: Sequence[RequestRecord], replicas: ReplicaStats | None = None
) -> WhatIf | None:
    """The estimates for a step's requests (and its replicas' loads, where it had several);
    ``None`` without requests."""
    if not records:
        return None
    last = max(r.finish_ns for r in records)
    tokens = sorted(r.output_tokens or 0 for r in records)
    caps = []
    for q in CAP_QUANTILES:
        cap = int(nearest_rank(tokens, q))
        ends, cut = [], 0
        for r in records:
            out = r.output_tokens or 0
            if cap > 0 and out > cap:
                start = r.first_token_ns if r.first_token_ns is not None else r.arrival_ns
                ends.append(start + int((r.finish_ns - start) * cap / out))
                cut += 1
            else:
                ends.append(r.finish_ns)
        caps.append(Cap(q, cap, max(0, last - max(ends)) / 1e9, cut))
    finishes = sorted(r.finish_ns for r in records)
    stops = []
    for q in STOP_QUANTILES:
        at = finishes[tail_start_index(len(finishes), q)]
        stops.append(Stop(q, (last - at) / 1e9, sum(1 for f in finishes if f > at)))
    balance = (
        None
        if replicas is None
        else Balance(replicas.count, replicas.balanced_saved_s, replicas.fewest)
    )
    return WhatIf(tuple(caps), tuple(stops), balance)
