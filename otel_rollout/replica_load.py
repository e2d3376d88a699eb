"""How a step's generation spread over its replicas: who ended when, and what balance would win.

A step served by several engines ends when the last of them ends. Each replica's *end* is the
finish of its last request of the step, measured from the step's first arrival (its
generation start); the spread between the earliest and the latest end is time the early
replicas stood idle while the step waited on the others.

Two estimates come from the ends alone (labelled as estimates wherever they are shown; the
model in docs/OUTPUTS.md):

* **balanced**: the same work spread evenly ends every replica at the *mean* of their ends, so
  balancing saves ``latest − mean``;
* **fewest replicas**: the work, ``Σ ends``, spread evenly over ``k`` replicas ends at
  ``Σ ends / k``; the fewest ``k`` that would still have ended no later than the step did is
  ``ceil(Σ ends / latest)`` — fewer than the step had: capacity to give back.

Both assume a replica's time grows in proportion to its work, as on a saturated engine; one
with spare batch slots absorbs more work at less cost than that. How far the balanced estimate
is from a real balanced rerun is measured in ``tests/vllm/test_replica_imbalance.py``.

Pure: records in, figures out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from otel_rollout.record import RequestRecord

__all__ = ["ReplicaLoad", "ReplicaStats", "analyze_replicas"]


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica's share of the step."""

    replica: str
    requests: int
    output_tokens: int
    end_s: float
    """Its last finish, seconds after the step's first arrival."""


@dataclass(frozen=True)
class ReplicaStats:
    """The step's replicas (two or more), busiest last, and the balance estimates."""

    loads: tuple[ReplicaLoad, ...]
    spread_s: float
    """The latest replica's end − the earliest's."""
    balanced_saved_s: float
    """Estimate: seconds the step's generation would have ended sooner, perfectly balanced."""
    fewest: int
    """Estimate: the fewest replicas that, balanced, would have ended the step no later."""

    @property
    def count(self) -> int:
        return len(self.loads)

    @property
    def busiest(self) -> ReplicaLoad:
        return self.loads[-1]


def replica_ends(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Each named replica's last finish (epoch ns); records without a replica are left out."""
    ends: dict[str, int] = {}
    for r in records:
        if r.replica is not None and r.finish_ns > ends.get(r.replica, 0):
            ends[r.replica] = r.finish_ns
    return ends


def analyze_replicas(records: Sequence[RequestRecord]) -> ReplicaStats | None:
    """The step's per-replica figures; ``None`` unless its requests name two replicas or more."""
    ends = replica_ends(records)
    if len(ends) < 2:
        return None
    start = min(r.arrival_ns for r in records)
    counts: dict[str, list[int]] = {name: [0, 0] for name in ends}
    for r in records:
        if r.replica is not None:
            tally = counts[r.replica]
            tally[0] += 1
            tally[1] += r.output_tokens or 0
    loads = tuple(
        sorted(
            (
                ReplicaLoad(name, counts[name][0], counts[name][1], max(0, end - start) / 1e9)
                for name, end in ends.items()
            ),
            key=lambda load: (load.end_s, load.replica),
        )
    )
    latest = loads[-1].end_s
    work = sum(load.end_s for load in loads)
    mean = work / len(loads)
    fewest = max(1, math.ceil(work / latest - 1e-9)) if latest > 0 else len(loads)
    return ReplicaStats(
        loads=loads,
        spread_s=latest - loads[0].end_s,
        balanced_saved_s=max(0.0, latest - mean),
        fewest=min(fewest, len(loads)),
    )
