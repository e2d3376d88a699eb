"""One step, every rank: the ranks of a data-parallel job put their step in one trace, with no
channel between them.

A colocated trainer (TRL under ``accelerate``/``torchrun``, one engine per rank) runs the same
step in every rank at once; each rank sees only its own requests, and the ranks share no channel
of ours (no Ray). What they do share is the job and the schedule: the launcher's run id
(``TORCHELASTIC_RUN_ID``, which ``torchrun`` gives every rank of a run; or
``OTEL_ROLLOUT_RUN_ID``), the step number and how many rounds with that number came before. A
trace id and a root span id hashed from those are the same in every rank and differ between
runs and steps: rank 0's step span is that root, every other rank's step span its child (a
remote parent, as across any process boundary). The figures of each step span stay the rank's
own (``rollout.step.rank`` of ``rollout.step.ranks``).

Pure: reads an environment mapping, no SDK.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import NamedTuple

__all__ = ["LAUNCHER_RUN_ID_ENV", "SharedStep", "job_ranks", "shared_step"]

LAUNCHER_RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
"""``torchrun`` sets it in every rank of a run (a fresh UUID with ``--standalone``); ``none``
where the user gave no ``--rdzv-id``, which names no run."""


class Ranks(NamedTuple):
    run_id: str
    rank: int
    world: int


class SharedStep(NamedTuple):
    """A step every rank opens: its trace, the root span's id (rank 0's step span) and who we are."""

    trace_id: int
    root_span_id: int
    rank: int
    ranks: int


def job_ranks(run_id: str | None = None, environ: Mapping[str, str] | None = None) -> Ranks | None:
    """This process's rank in a multi-rank job (the launcher's ``RANK`` of ``WORLD_SIZE``) and the
    job's run id (``run_id``: ``OTEL_ROLLOUT_RUN_ID``, else the launcher's); ``None`` for a single
    process, or where no run id tells this run from another (ranks then keep their own traces)."""
    env = os.environ if environ is None else environ
    try:
        world, rank = int(env.get("WORLD_SIZE", "1")), int(env.get("RANK", "0"))
    except ValueError:
        return None
    if world <= 1 or not 0 <= rank < world:
        return None
    found = job_run_id(run_id, env)
    return Ranks(found, rank, world) if found else None


def job_run_id(run_id: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The job's run id: ``run_id`` (``OTEL_ROLLOUT_RUN_ID``), else the launcher's
    (``TORCHELASTIC_RUN_ID``, unless torchrun's ``none``); ``None`` where neither names one."""
    env = os.environ if environ is None else environ
    found = (run_id or "").strip()
    if not found:
        launcher = env.get(LAUNCHER_RUN_ID_ENV, "").strip()
        found = "" if launcher.lower() in ("", "none") else launcher
    return found or None


def shared_step(ranks: Ranks, key: str) -> SharedStep:
    """The ids every rank derives for step ``key`` (its number and how many rounds of that number
    came before: the same schedule in every rank)."""
    digest = hashlib.sha256(f"otel_rollout/{ranks.run_id}/{key}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return SharedStep(trace_id, span_id, ranks.rank, ranks.world)
