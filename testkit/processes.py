"""Every test ends what it started: Ray workers, engine servers, jobs' children.

A Ray worker outlives its raylet for minutes (~20 % CPU each on a 2-core box) when the driver
that started it is gone; a job run with ``subprocess.run`` leaves such orphans to ``init``, out
of the test's reach. So the test process makes itself a *child subreaper* (Linux
``PR_SET_CHILD_SUBREAPER``): orphans of anything it started are re-parented to it, stay its
descendants, and can be found and ended when the test is done.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

import psutil

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans; ``False`` where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def descendant_pids() -> set[int]:
    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def end_new(before: Iterable[int], grace_s: float = 10.0) -> list[str]:
    """End this process's descendants that were not among ``before``: each gets ``grace_s`` to
    exit by itself (a Ray worker notices its raylet is gone), then SIGKILL. Returns the command
    lines of those that had to be killed."""
    known = set(before)
    procs = []
    for pid in descendant_pids() - known:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    if not procs:
        return []
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    killed = []
    for proc in alive:
        try:
            killed.append(" ".join(proc.cmdline())[:120] or proc.name())
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=5)
    return killed


def reap_zombies() -> None:
    """Collect the exit status of orphans that ended after nobody waited for them."""
    for proc in psutil.Process().children():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                proc.wait(timeout=0)
        except (psutil.Error, psutil.TimeoutExpired):
            continue


def run_reaped(
    args: list[str], grace_s: float = 10.0, **kwargs: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` that ends, afterwards, whatever the command left running (its Ray
    workers, an engine's helpers); with :func:`become_subreaper` those are still ours to find."""
    before = descendant_pids()
    try:
        return subprocess.run(args, **kwargs)
    finally:
        end_new(before, grace_s)
        reap_zombies()
