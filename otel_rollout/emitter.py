"""The background emitter: finished request records become telemetry off the caller's thread.

A 10,000-request ``LLM.generate`` used to spend ≈ 1.8 s after the engine returned making spans and
metric points — the OpenTelemetry SDK's own cost, paid while the trainer's GPUs wait. The wrappers
now build the records (cheap), hand them to one :class:`Emitter` per
:class:`~otel_rollout.telemetry.Telemetry` and return the engine's outputs at once; a daemon thread
turns the records into spans and metric points.

Policy, in one place:

* **Bounded**: at most ``OTEL_ROLLOUT_EMIT_QUEUE`` records wait. A submission that does not fit is
  refused whole-or-part — never blocking the caller, never growing memory — and :meth:`submit`
  says how many: their owner records their metric points at once and drops their spans (counted
  in ``rollout.telemetry.dropped``, named in one warning that says which setting to raise).
  ``OTEL_ROLLOUT_EMIT_QUEUE=0`` turns the emitter off: records are emitted inline, in the caller.
* **Paced**: every ``pace_every`` spans the emitter lets the tracer provider drain (its
  ``force_flush``) and waits for that, so a burst of 80,000 spans never overflows a
  ``BatchSpanProcessor`` queue (2,048 by default) and loses spans there. It waits at most
  ``PACE_WAIT_S`` and never starts a second drain while one is still running: an exporter that
  hangs (collector down) costs the emitter those seconds once, not the queue's memory; its spans
  are then dropped where they always were, in the SDK's batch queue.
* **Flushed**: :func:`flush_all` waits for everything submitted before the call (used by
  ``otel_rollout.sdk.force_flush`` and at exit); at exit the wait lasts as long as the emitter makes
  progress, and at most ``OTEL_ROLLOUT_EXIT_TIMEOUT`` seconds without any.
* **Fork-safe**: ``os.register_at_fork`` waits (at most ``FORK_WAIT_S``) for the emitter to finish
  the chunk it is on — so the child inherits no SDK lock taken mid-record — and gives the child
  an empty queue and no thread; the child's first record starts its own. Spawned processes (Ray
  workers, vLLM's engine processes) start fresh anyway.

Why one module of this size: one queue and its four rules below; each rule reads the same lock,
counters and thread state, and splitting them would spread one invariant over several files.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from otel_rollout.record import RequestRecord

_logger = logging.getLogger(__name__)

Sink = Callable[[Sequence["RequestRecord"], "Context", bool], None]
"""Makes the metric points of some records under one parent, and their spans when the flag is
true (runs on the emitter thread; at a bounded exit the flag goes false, see :func:`drain_all`)."""

_CHUNK = 256
"""Records emitted between two progress updates (what flushers and the exit wait observe)."""

_GATHER_S = 0.002
"""After a wake-up, how long the emitter lets records gather before it starts on them."""

NEVER_ANSWERED_S = 0.5
"""At exit, how long a first drain may go unanswered before the exporter counts as down."""

PACE_WAIT_S = 5.0
"""How long the emitter waits for one drain of the tracer provider before it goes on: generous,
since a slow but working exporter is what pacing is for; a dead one costs this once, then the
emitter runs on without pacing until that drain returns."""


_THREAD = threading.local()


def in_emitter_thread() -> bool:
    """Whether this thread is one of ours (an emitter, or a pacer draining the provider for one).

    A provider's ``force_flush`` first waits for the emitters (see
    :func:`otel_rollout.sdk.drain_before_provider_flush`); called from our own threads that wait
    would be on ourselves, so there it does not wait.
    """
    return getattr(_THREAD, "ours", False)


class Pacer:
    """Runs the provider's drain on a helper thread; the emitter waits for it, within bounds."""

    def __init__(self, drain: Callable[[], object], wait_s: float) -> None:
        self._drain = drain
        self._wait_s = wait_s
        self._done = threading.Event()
        self._busy = False
        self._since = 0.0
        self.answered = 0
        """Drains that returned: the exporter has answered at least this often."""

    def pace(self) -> bool:
        """Drain and wait; ``False`` if it did not finish in time or one is still running."""
        if self._busy:
            return False  # the last drain is stuck in the exporter: do not pile up more
        self._busy = True
        self._since = time.monotonic()
        self._done.clear()
        threading.Thread(target=self._run, name="otel_rollout-pace", daemon=True).start()
        return self._done.wait(self._wait_s)

    @property
    def busy(self) -> bool:
        """A drain is in the exporter now."""
        return self._busy

    def release(self) -> None:
        """Stop waiting for the drain in progress (it goes on; no new one starts while it does)."""
        self._done.set()

    def stuck(self, after_s: float) -> bool:
        """A drain has been waiting on the exporter for longer than ``after_s`` — or longer than
        ``NEVER_ANSWERED_S`` if no drain ever returned (collector down since the start)."""
        limit = after_s if self.answered else min(after_s, NEVER_ANSWERED_S)
        return self._busy and time.monotonic() - self._since > limit

    def _run(self) -> None:
        _THREAD.ours = True
        try:
            self._drain()
        except Exception:  # the exporter's failure; the SDK logged it
            _logger.debug("otel_rollout: tracer provider drain failed", exc_info=True)
        finally:
            self.answered += 1
            self._busy = False
            self._done.set()


class Emitter:
    """A bounded FIFO of record batches and the daemon thread that emits them."""

    def __init__(
        self,
        sink: Sink,
        capacity: int,
        *,
        name: str = "otel_rollout-emitter",
        pace: Callable[[], object] | None = None,
        pace_every: int = 512,
        on_drop: Callable[[int], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._sink = sink
        self.capacity = capacity
        self._name = name
        self._drain_provider = pace
        self._pace_every = max(1, pace_every)
        self._on_drop = on_drop
        self._on_error = on_error
        self.dropped = 0
        """Records refused because the queue was full (since this process started it)."""
        self.spans = True
        """Whether records still become spans; metric points are made either way."""
        self.spans_skipped = 0
        """Records emitted as metric points only (a bounded exit gave their spans up)."""
        self._reset()
        _LIVE.add(self)

    def _reset(self) -> None:
        """Fresh state: at creation, and in a forked child (whose parent keeps its own queue).

        The caller's path never takes a lock the emitter thread holds while it runs Python code:
        with the GIL, such a lock makes the caller wait for the emitter's next switch interval
        (measured: ~200 µs per streamed request). Callers share ``_submit_lock`` among
        themselves; the emitter alone writes ``_processed``; ``_wake`` rouses an idle emitter;
        ``_cond`` is only for those who wait for progress (flush, exit).
        """
        self._submit_lock = threading.Lock()
        self._work_lock = threading.Lock()
        """Held while records are being emitted: a fork waits for it, so the child never inherits
        an SDK lock (metric aggregation, span exporter) taken by this thread mid-record."""
        self._wake = threading.Event()
        self._cond = threading.Condition(threading.Lock())
        self._waiters = 0
        self._queue: deque[tuple[Sequence[RequestRecord], Context]] = deque()
        self._submitted = 0
        self._processed = 0
        self._working = False
        self._since_pace = 0
        self._pacer = (
            None if self._drain_provider is None else Pacer(self._drain_provider, PACE_WAIT_S)
        )
        self._thread: threading.Thread | None = None

    # --- the caller's side ----------------------------------------------------------------

    def submit(self, records: Sequence[RequestRecord], parent: Context) -> int:
        """Queue ``records`` for emission under ``parent``; returns how many were dropped."""
        count = len(records)
        if not count:
            return 0
        dropped = 0
        with self._submit_lock:
            room = self.capacity - (self._submitted - self._processed)
            if count > room:
                dropped = count - max(0, room)
                records = records[: max(0, room)]
                count -= dropped
                self.dropped += dropped
            if count:
                self._submitted += count
                self._queue.append((records, parent))
                if self._thread is None:
                    self._start()
        if count and not self._wake.is_set():
            self._wake.set()
        if dropped and self._on_drop is not None:
            self._on_drop(dropped)
        return dropped

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        register_exit_drain()

    @property
    def pending(self) -> int:
        """Records submitted and not yet emitted."""
        return self._submitted - self._processed

    def flush(self, timeout_s: float) -> bool:
        """Wait until every record submitted before this call is emitted; ``True`` if all were."""
        target = self._submitted
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._waiters += 1
            try:
                while self._processed < target:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._alive():
                        return False
                    self._cond.wait(min(left, 0.1))
            finally:
                self._waiters -= 1
        return True

    def drain(
        self,
        stall_s: float,
        give_up: Callable[[], bool] = lambda: False,
        busy_s: float | None = None,
    ) -> bool:
        """Wait while the emitter makes progress; ``False`` when it stopped making any.

        Exit uses this: emitting 80,000 queued records takes seconds of CPU, which is progress
        and worth waiting for. Progress is a chunk of records emitted. While the emitter is at
        work — inside a chunk, or waiting on a drain of the exporter — a chunk may take long on
        a loaded machine or behind a slow exporter, so the wait lasts up to ``busy_s`` (default
        ``stall_s``) since the last chunk; while it is idle with records pending, ``stall_s``
        since it was last seen at work or emitting (the moment a drain returns is no stall).
        ``give_up`` ends the wait early (the exporter is known not to answer).
        """
        busy_s = stall_s if busy_s is None else max(busy_s, stall_s)
        target = self._submitted
        seen = self._processed
        last = active = time.monotonic()
        with self._cond:
            self._waiters += 1
            try:
                while self._processed < target:
                    now = time.monotonic()
                    if self._processed != seen:
                        seen, last, active = self._processed, now, now
                    if self._at_work():
                        active = now
                        left = last + busy_s - now
                    else:
                        # idle since it was last seen at work, not since its last chunk: a
                        # drain of a slow exporter that just returned is no stall of the emitter
                        left = active + stall_s - now
                    if left <= 0 or not self._alive() or give_up():
                        return False
                    self._cond.wait(min(left, 0.05))
            finally:
                self._waiters -= 1
        return True

    def _at_work(self) -> bool:
        """Emitting a chunk now, or waiting for a drain of the exporter (while spans are made)."""
        pacer = self._pacer
        return self._working or (self.spans and pacer is not None and pacer.busy)

    def metrics_only(self) -> None:
        """From now on, records become metric points only: no spans, no waiting on the exporter.

        A bounded exit gives spans up, never counts: metric points cost CPU only, so the rest of
        the queue is recorded in a fraction of a second whatever the span exporter is doing.
        """
        self.spans = False
        if self._pacer is not None:
            self._pacer.release()

    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- the emitter thread ----------------------------------------------------------------

    def _run(self) -> None:
        _THREAD.ours = True
        queue, wake = self._queue, self._wake
        while True:
            if not queue:
                wake.clear()
                if not queue:  # a submit between the check and the clear set it again
                    wake.wait()
                    # Let a stream of single records gather: one wake-up per window instead of
                    # one per request (a thread switch costs both threads several µs).
                    time.sleep(_GATHER_S)
                continue
            records, parent = queue.popleft()
            if len(records) < _CHUNK and queue and queue[0][1] is parent:
                records = self._gather(records, parent)
            for start in range(0, len(records), _CHUNK):
                chunk = records[start : start + _CHUNK]
                try:
                    spans = self.spans
                    with self._work_lock:
                        self._working = True
                        try:
                            self._sink(chunk, parent, spans)
                        finally:
                            self._working = False
                    if not spans:
                        self.spans_skipped += len(chunk)
                except Exception as exc:  # the thread must outlive any failure of ours
                    if self._on_error is not None:
                        self._on_error(exc)
                count = len(chunk)
                del chunk
                self._after(count)
            # Hold nothing while idle: a record's error keeps its traceback, whose frames keep
            # the caller's per-call state (vLLM step times, stream observers) alive.
            del records, parent

    def _gather(self, records: Sequence[RequestRecord], parent: Context) -> list[RequestRecord]:
        """The next submissions under the same parent, joined to ``records`` (up to a chunk).

        A stream ends one request at a time: each is a submission of one record, and emitting
        them one by one cost about 20 µs a record more than the same records as one batch
        (figure 1's stream case). Only this thread pops, so ``queue[0]`` is stable here.
        """
        queue = self._queue
        joined = list(records)
        while queue and queue[0][1] is parent and len(joined) < _CHUNK:
            joined.extend(queue.popleft()[0])
        return joined

    def _after(self, count: int) -> None:
        self._since_pace += count
        if self._pacer is not None and self.spans and self._since_pace >= self._pace_every:
            self._since_pace = 0
            self._pacer.pace()
        self._processed += count  # only this thread writes it
        if self._waiters:
            with self._cond:
                self._cond.notify_all()


# --- every emitter of the process --------------------------------------------------------------

_LIVE: weakref.WeakSet[Emitter] = weakref.WeakSet()
_EXIT_REGISTERED = threading.Lock()
_exit_state: list[bool] = []
_exit_drained_elsewhere: list[bool] = []
_exit_state_draining: list[bool] = []


def drain_at_exit_elsewhere() -> None:
    """Called by ``otel_rollout.sdk.bound_exit``: its handler drains, then shuts providers down."""
    _exit_drained_elsewhere.append(True)


_BEFORE_FLUSH: list[Callable[[], object]] = []


def before_flush(hook: Callable[[], object]) -> None:
    """Run ``hook`` at the start of every :func:`flush_all` and :func:`drain_all`: records held
    elsewhere (requests waiting for their step's end, :mod:`otel_rollout.sampling`) are handed to
    the emitters before those are waited for."""
    if hook not in _BEFORE_FLUSH:
        _BEFORE_FLUSH.append(hook)


def _run_before_flush() -> None:
    for hook in list(_BEFORE_FLUSH):
        try:
            hook()
        except Exception:  # ours: the flush itself must go on
            _logger.debug("otel_rollout: a before-flush hook failed", exc_info=True)


def flush_all(timeout_s: float) -> bool:
    """Wait (at most ``timeout_s`` in all) until every emitter has emitted what it was given."""
    _run_before_flush()
    deadline = time.monotonic() + timeout_s
    ok = True
    for emitter in list(_LIVE):
        ok = emitter.flush(max(0.0, deadline - time.monotonic())) and ok
    return ok


def exiting() -> bool:
    """Whether the process is in its exit drain (a provider's shutdown then does not wait again)."""
    return bool(_exit_state_draining)


def exporter_timeout_s() -> float:
    """How long the OTLP span exporter itself waits for one export (``OTEL_EXPORTER_OTLP_*TIMEOUT``,
    seconds, 10 by default): a drain that took longer is stuck by the exporter's own measure."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        try:
            return max(0.0, float(os.environ[name]))
        except (KeyError, ValueError):
            continue
    return 10.0


def drain_all(stall_s: float) -> bool:
    """Exit: emit everything queued; counts always, spans while the exporter takes them.

    Spans are waited for while progress is made — chunks of records emitted; a chunk in the
    making or a drain of the span exporter under way counts until the exporter's own timeout
    (:func:`exporter_timeout_s`), since on a loaded machine one chunk can take seconds — and
    given up when the emitter sat idle without progress for ``stall_s``
    (``OTEL_ROLLOUT_EXIT_TIMEOUT``), or the exporter is stuck: one drain longer than its own
    timeout, or ``NEVER_ANSWERED_S`` for one that never answered (collector down since the
    start). Then the rest of the queue becomes metric points
    only (:meth:`Emitter.metrics_only`): a bounded exit drops spans, never counts.
    """
    _exit_state_draining.append(True)
    _run_before_flush()
    live = [e for e in list(_LIVE) if e.pending]
    stuck_s = max(stall_s, exporter_timeout_s())
    spans_ok = True
    for emitter in live:
        spans_ok = emitter.drain(stall_s, lambda: exporter_stuck(stuck_s), stuck_s) and spans_ok
    if spans_ok:
        return True
    before = sum(e.spans_skipped for e in live)
    for emitter in live:
        emitter.metrics_only()
    counts_ok = True
    for emitter in live:
        counts_ok = emitter.drain(stall_s, busy_s=stuck_s) and counts_ok
    skipped = sum(e.spans_skipped for e in live) - before
    if counts_ok and skipped == 0:
        return True  # the wait gave up, but the exporter took every span meanwhile
    if counts_ok:
        _logger.warning(
            "otel_rollout: %d request span(s) were not made at exit: the span exporter "
            "did not take them (stuck, or no progress for %.1f s: OTEL_ROLLOUT_EXIT_TIMEOUT); "
            "their metric points were recorded, so counts are complete",
            skipped,
            stall_s,
        )
    else:
        _logger.warning(
            "otel_rollout: %d request record(s) were not emitted at exit, spans and metric "
            "points alike: the emitter made no progress for %.1f s (OTEL_ROLLOUT_EXIT_TIMEOUT)",
            sum(e.pending for e in live),
            stall_s,
        )
    return False


def exporter_answered() -> None:
    """The tracer provider's own ``force_flush`` completed: its span exporter has answered. A
    first drain at exit is then a slow exporter's, not a dead one's (``NEVER_ANSWERED_S``), even
    where no drain of ours had returned yet (a flush by the user made every export so far)."""
    for live in list(_LIVE):
        if live._pacer is not None:
            live._pacer.answered += 1


def exporter_stuck(after_s: float) -> bool:
    """Whether some emitter's drain of its tracer provider has been in the exporter > ``after_s``.

    At exit (``after_s`` = ``OTEL_ROLLOUT_EXIT_TIMEOUT``) this means the span exporter does not
    answer within the bound (collector down or hanging): the providers' final shutdown would wait
    on the same exporter, so exit does not wait for it.
    """
    return any(e._pacer.stuck(after_s) for e in list(_LIVE) if e._pacer is not None)


def register_exit_drain() -> None:
    """Once per process, when the first emitter starts or requests first wait in a step: drain
    at exit (unless ``bound_exit`` will).

    ``atexit`` runs handlers last-registered first, so this one usually runs before the SDK's own
    provider shutdown (registered when the provider was made) — the records reach the exporter.
    """
    with _EXIT_REGISTERED:
        if _exit_state:
            return
        _exit_state.append(True)
    atexit.register(_drain_at_exit)


def _drain_at_exit() -> None:
    if _exit_drained_elsewhere:
        return  # sdk's bounded shutdown drains first, then shuts the providers down
    from otel_rollout.config import load_config

    drain_all(load_config(warn=False).exit_timeout)


_held_for_fork: list[Emitter] = []

FORK_WAIT_S = 1.0
"""How long a fork waits for an emitter to finish the chunk it is on."""


def _before_fork() -> None:
    for emitter in list(_LIVE):
        if emitter._work_lock.acquire(timeout=FORK_WAIT_S):
            _held_for_fork.append(emitter)


def _after_fork_in_parent() -> None:
    while _held_for_fork:
        _held_for_fork.pop()._work_lock.release()


def _after_fork_in_child() -> None:
    _held_for_fork.clear()
    global _EXIT_REGISTERED
    _EXIT_REGISTERED = threading.Lock()  # the parent may have held it at the fork
    for emitter in list(_LIVE):
        emitter._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
