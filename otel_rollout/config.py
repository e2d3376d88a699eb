"""Every ``OTEL_ROLLOUT_*`` setting, parsed and validated in one place.

A training job must never die because an observability variable is malformed, so parsing never
raises: each bad value yields one :class:`Problem` (logged once as a warning naming the variable, the
value and the default used instead) and the default takes its place. ``otel-rollout check`` turns
the same problems into a non-zero exit, so CI or a launcher can refuse a bad configuration early.

Why one module of this size: it is the one table of settings by design — every variable's name,
default, parser and documentation side by side, which ``otel-rollout check`` and the docs test
read.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

_logger = logging.getLogger(__name__)

T = TypeVar("T")

# RL responses run from a fraction of a second to hours: the GenAI semconv defaults stop at ~82 s.
DEFAULT_LATENCY_BUCKETS: tuple[float, ...] = (
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2,
    5,
    10,
    20,
    30,
    60,
    120,
    180,
    300,
    600,
    900,
    1200,
    1800,
    3600,
    7200,
)
DEFAULT_TTFT_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
)
DEFAULT_TPOT_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
)
DEFAULT_TOKEN_BUCKETS: tuple[float, ...] = (
    1,
    4,
    16,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
    32768,
    65536,
    131072,
    262144,
)
DEFAULT_RATIO_BUCKETS: tuple[float, ...] = (1, 1.25, 1.5, 2, 3, 5, 10, 20, 50, 100)
# rollout.step.idle_capacity is in request-seconds (peak in-flight x window): a step of 512
# requests over 10 minutes can leave ~10^5 of them unused, far past the latency buckets' 7200.
IDLE_CAPACITY_BUCKETS: tuple[float, ...] = (
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1000,
    2500,
    5000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
)

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The standard GenAI opt-in; we read it rather than inventing our own."""
SEMCONV_OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
"""The standard semantic-conventions opt-in (a comma-separated list, one value per signal)."""
GEN_AI_LATEST = "gen_ai_latest_experimental"
"""Its GenAI value: the GenAI conventions' newest names (semantic-conventions-genai), as
OpenTelemetry contrib's instrumentations read it."""
RL_LATEST = "rl_latest_experimental"
"""Our token in the same list: the proposed ``rl.*`` conventions' names
(:mod:`otel_rollout.rl_conventions`)."""


class ConfigError(ValueError):
    """A value that cannot be used; carries a message meant for a human."""


@dataclass(frozen=True)
class Problem:
    variable: str
    value: str
    reason: str
    default: str

    def message(self) -> str:
        return (
            f"{self.variable}={self.value!r} is invalid ({self.reason}); "
            f"using the default {self.default} instead"
        )


@dataclass(frozen=True)
class RolloutConfig:
    """The effective settings; the defaults here are the only ones (``SETTINGS`` reads them)."""

    latency_buckets: tuple[float, ...] = DEFAULT_LATENCY_BUCKETS
    ttft_buckets: tuple[float, ...] = DEFAULT_TTFT_BUCKETS
    tpot_buckets: tuple[float, ...] = DEFAULT_TPOT_BUCKETS
    token_buckets: tuple[float, ...] = DEFAULT_TOKEN_BUCKETS
    histograms: str = "exponential"
    content_max_length: int = 1024
    tail_quantile: float = 0.9
    step_summary: bool = False
    summary_stragglers: int = 5
    batch_as_step: bool = False
    exit_timeout: float = 1.5
    stall_timeout: float = 120.0
    step_wait: float = 5.0
    emit_queue: int = 262_144
    sample_rate: float = 0.02
    sample_min_step: int = 64
    sample_slowest: int = 5
    report_dir: str | None = None
    step_log: str | None = None
    run_id: str | None = None
    http_paths: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions", "/generate")
    capture_content: bool = False
    gen_ai_latest: bool = False
    rl_latest: bool = False
    problems: tuple[Problem, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: its parser, default and the sentence docs/CONFIGURATION.md
    shows."""

    env: str
    attr: str
    parse: Callable[[str], T]
    doc: str
    render: Callable[[T], str] = str

    @property
    def default(self) -> T:
        return cast(T, RolloutConfig.__dataclass_fields__[self.attr].default)

    def read(self, environ: Mapping[str, str]) -> tuple[T, Problem | None]:
        raw = environ.get(self.env)
        if raw is None or raw.strip() == "":
            return self.default, None
        try:
            return self.parse(raw.strip()), None
        except ConfigError as exc:
            return self.default, Problem(self.env, raw, str(exc), self.render(self.default))


# --- parsers: each raises ConfigError with a reason a user can act on --------------------


def _bool(raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ConfigError("expected true or false")


def _finite(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError("must be a finite number")
    return value


def _buckets(raw: str) -> tuple[float, ...]:
    parts = [p.strip() for p in raw.split(",")]
    if any(p == "" for p in parts):
        raise ConfigError("empty entry in comma-separated list")
    values = tuple(_finite(p) for p in parts)
    if len(values) > 200:
        raise ConfigError(f"{len(values)} boundaries; at most 200 keep scrapes cheap")
    if any(v < 0 for v in values):
        raise ConfigError("boundaries must not be negative")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ConfigError("boundaries must be strictly increasing")
    return values


def _quantile(raw: str) -> float:
    value = _finite(raw)
    if not 0.0 < value < 1.0:
        raise ConfigError("must lie strictly between 0 and 1")
    return value


def _share(raw: str) -> float:
    value = _finite(raw)
    if not 0.0 <= value <= 1.0:
        raise ConfigError("must lie between 0 and 1")
    return value


def _int_range(low: int, high: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{raw!r} is not an integer") from None
        if not low <= value <= high:
            raise ConfigError(f"must be between {low} and {high}")
        return value

    return parse


def _seconds_range(low: float, high: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        value = _finite(raw)
        if not low <= value <= high:
            raise ConfigError(f"must be between {low:g} and {high:g} seconds")
        return value

    return parse


def _histograms(raw: str) -> str:
    low = raw.lower()
    if low not in ("exponential", "explicit"):
        raise ConfigError("expected exponential or explicit")
    return low


def _path(raw: str) -> str:
    if "\x00" in raw:
        raise ConfigError("contains a NUL byte")
    return os.path.expanduser(raw)


def _label(raw: str) -> str:
    if not raw.isprintable():
        raise ConfigError("contains a character that cannot be printed")
    return raw


def _paths(raw: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in raw.split(","))
    if any(not p.startswith("/") for p in parts):
        raise ConfigError("expected comma-separated URL paths, each starting with /")
    return parts


def _render_buckets(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:g}" for v in values)


def _render_opt(value: Any) -> str:
    return "(unset)" if value is None else str(value)


def _render_bool(value: bool) -> str:
    return "true" if value else "false"


SETTINGS: tuple[Setting[Any], ...] = (
    Setting(
        "OTEL_ROLLOUT_LATENCY_BUCKETS",
        "latency_buckets",
        _buckets,
        "Histogram boundaries in seconds for request duration, queue time and step durations.",
        _render_buckets,
    ),
    Setting(
        "OTEL_ROLLOUT_TTFT_BUCKETS",
        "ttft_buckets",
        _buckets,
        "Histogram boundaries in seconds for time to first token.",
        _render_buckets,
    ),
    Setting(
        "OTEL_ROLLOUT_TPOT_BUCKETS",
        "tpot_buckets",
        _buckets,
        "Histogram boundaries in seconds for time per output token.",
        _render_buckets,
    ),
    Setting(
        "OTEL_ROLLOUT_TOKEN_BUCKETS",
        "token_buckets",
        _buckets,
        "Histogram boundaries in tokens for input/output token usage (response length).",
        _render_buckets,
    ),
    Setting(
        "OTEL_ROLLOUT_HISTOGRAMS",
        "histograms",
        _histograms,
        "Latency, TTFT, TPOT, queue-time and token histograms: `exponential` (base-2, served as "
        "Prometheus native histograms) where the reader supports it, or `explicit` (the buckets "
        "above) everywhere.",
    ),
    Setting(
        "OTEL_ROLLOUT_CONTENT_MAX_LENGTH",
        "content_max_length",
        _int_range(0, 1_000_000),
        "Characters of prompt/response text kept per message when content capture is on.",
    ),
    Setting(
        "OTEL_ROLLOUT_TAIL_QUANTILE",
        "tail_quantile",
        _quantile,
        "A step's tail starts when this share of its requests has finished: the requests "
        "after it are the tail the summary, the step span and the dashboards name, and "
        "step-aware sampling keeps each one's span.",
    ),
    Setting(
        "OTEL_ROLLOUT_STEP_SUMMARY",
        "step_summary",
        _bool,
        "Print a compact summary to stderr when each step ends.",
        _render_bool,
    ),
    Setting(
        "OTEL_ROLLOUT_SUMMARY_STRAGGLERS",
        "summary_stragglers",
        _int_range(0, 1000),
        "How many of the slowest requests (with trace ids) the step summary lists.",
    ),
    Setting(
        "OTEL_ROLLOUT_BATCH_AS_STEP",
        "batch_as_step",
        _bool,
        "Treat each offline batch call made outside any rollout_step() as a step of its own.",
        _render_bool,
    ),
    Setting(
        "OTEL_ROLLOUT_EXIT_TIMEOUT",
        "exit_timeout",
        _seconds_range(0, 600),
        "At exit, wait at most this many seconds for telemetry to be exported.",
    ),
    Setting(
        "OTEL_ROLLOUT_STALL_TIMEOUT",
        "stall_timeout",
        _seconds_range(0, 86_400),
        "An engine with requests in flight that produces no output for this many seconds is "
        "stalled: one warning line (with its step's progress), `rollout.engine.stalled` = 1, "
        "and a line when it resumes. Time held by a weight sync, sleep or pause does not count. "
        "0 turns the watch off.",
    ),
    Setting(
        "OTEL_ROLLOUT_STEP_WAIT",
        "step_wait",
        _seconds_range(0, 3600),
        "At a step's end, wait at most this many seconds for requests reported by other "
        "processes (Ray actors) whose calls have not reported yet; then the step is partial.",
    ),
    Setting(
        "OTEL_ROLLOUT_EMIT_QUEUE",
        "emit_queue",
        _int_range(0, 100_000_000),
        "Request records that may wait for the background emitter, which makes their spans "
        "and metric points off the caller's thread; beyond it their spans are dropped (counted "
        "in rollout.telemetry.dropped) and their metric points recorded in the caller, so "
        "counts stay complete. 0 emits inline, in the caller (synchronous).",
    ),
    Setting(
        "OTEL_ROLLOUT_SAMPLE_RATE",
        "sample_rate",
        _share,
        "Step-aware sampling of request spans: the share of a large step's ordinary requests "
        "whose spans are kept (every 1/rate-th in finish order). Errors, aborts, truncations and the step's tail "
        "are kept besides; metric points are recorded for every request, exemplars name only "
        "kept spans. The default, 0.02, keeps about 13 % of a long-tailed step's spans (the "
        "tail's 10 % among them); 1 keeps every span.",
    ),
    Setting(
        "OTEL_ROLLOUT_SAMPLE_MIN_STEP",
        "sample_min_step",
        _int_range(0, 1_000_000_000),
        "Step-aware sampling: a step with at most this many requests started keeps every span.",
    ),
    Setting(
        "OTEL_ROLLOUT_SAMPLE_SLOWEST",
        "sample_slowest",
        _int_range(0, 10_000),
        "Step-aware sampling: the spans of this many of a step's longest requests are kept "
        "besides, decided at the step's end (the slowest of an agentic step need not finish "
        "last); until then each candidate's span and metric points wait. The default is the "
        "stragglers a step summary names (OTEL_ROLLOUT_SUMMARY_STRAGGLERS): keep it at least "
        "that, and every straggler named has its span. 0: none.",
    ),
    Setting(
        "OTEL_ROLLOUT_REPORT_DIR",
        "report_dir",
        _path,
        "Write a PNG per step (request waterfall + response-length histogram) here; "
        "needs the [report] extra.",
        _render_opt,
    ),
    Setting(
        "OTEL_ROLLOUT_STEP_LOG",
        "step_log",
        _path,
        "Append one JSON line per finished step (its requests' timelines) to this file; "
        "`otel-rollout report` renders it.",
        _render_opt,
    ),
    Setting(
        "OTEL_ROLLOUT_RUN_ID",
        "run_id",
        _label,
        "Names this run to every rank of a multi-rank job (default: `TORCHELASTIC_RUN_ID`, "
        "which `torchrun` sets): the ranks' step spans of one step then share one trace.",
        _render_opt,
    ),
    Setting(
        "OTEL_ROLLOUT_HTTP_PATHS",
        "http_paths",
        _paths,
        "URL path endings of engine requests that HTTP clients (httpx: the `openai` client, "
        "slime) send inside a step: they get the step's context as headers, and their "
        "responses are counted in the step (timing source `client`).",
        ",".join,
    ),
)


def _capture_content(environ: Mapping[str, str]) -> tuple[bool, Problem | None]:
    raw = environ.get(CAPTURE_CONTENT_ENV)
    if raw is None or raw.strip() == "":
        return False, None
    try:
        return _bool(raw.strip()), None
    except ConfigError as exc:
        # The GenAI instrumentations also accept modes such as SPAN_ONLY; any of those means "on".
        if raw.strip().upper() in ("SPAN_ONLY", "SPAN_AND_EVENT", "EVENT_ONLY"):
            return True, None
        return False, Problem(CAPTURE_CONTENT_ENV, raw, str(exc), "false")


def _opted_in(environ: Mapping[str, str], token: str) -> bool:
    """Contrib's rule (``_OpenTelemetrySemanticConventionStability``): the list holds ``token``
    (``gen_ai_latest_experimental``, ``rl_latest_experimental``). Any other value belongs to
    another signal's instrumentation (``http``, ``database``), so nothing here is malformed.
    Read per configuration, not once per process as contrib caches it, so each ``load_config``
    sees the environment it is given."""
    raw = environ.get(SEMCONV_OPT_IN_ENV) or ""
    return token in (part.strip() for part in raw.split(","))


RETIRED: dict[str, tuple[str, str]] = {
    "OTEL_ROLLOUT_SAMPLE_TAIL": (
        "OTEL_ROLLOUT_TAIL_QUANTILE",
        "no longer read: a step's tail is one setting, and step-aware sampling keeps the spans "
        "of the tail the step's analytics name",
    ),
}
"""Variables earlier releases read: the setting that replaced each, and why. A stale one is
reported (``otel-rollout check`` fails on it), never silently ignored."""


def _retired(env: Mapping[str, str], values: Mapping[str, Any]) -> list[Problem]:
    by_env = {s.env: s for s in SETTINGS}
    out = []
    for name, (replacement, reason) in RETIRED.items():
        if name in env:
            setting = by_env[replacement]
            now = setting.render(values[setting.attr])
            out.append(Problem(name, env[name], reason, f"{replacement}={now}"))
    return out


def load_config(environ: Mapping[str, str] | None = None, *, warn: bool = True) -> RolloutConfig:
    """Read the environment; never raises. ``warn`` logs each problem once, as a warning."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for setting in SETTINGS:
        values[setting.attr], problem = setting.read(env)
        if problem:
            problems.append(problem)
    values["capture_content"], problem = _capture_content(env)
    if problem:
        problems.append(problem)
    values["gen_ai_latest"] = _opted_in(env, GEN_AI_LATEST)
    values["rl_latest"] = _opted_in(env, RL_LATEST)
    problems.extend(_retired(env, values))
    if warn:
        for problem in problems:
            _logger.warning("otel_rollout: %s", problem.message())
    return RolloutConfig(**values, problems=tuple(problems))


def _writable(path: str, *, directory: bool) -> str | None:
    """Why nothing could be written at ``path`` (a file, or a directory to create), else None.

    Probes for real — creates what the run would create, then removes what the probe made — since
    ``os.access`` answers yes to root for paths where nothing can be created (``/proc/x/...``),
    and root is the usual user in RL containers. An existing step log is opened for appending
    (as the run will), never truncated.
    """
    target = os.path.abspath(path)
    if os.path.exists(target) and directory != os.path.isdir(target):
        return "is a directory" if not directory else "is not a directory"
    made: list[str] = []  # what the probe created, removed again in reverse order
    folder = target if directory else os.path.dirname(target)
    try:
        missing = folder
        while missing and not os.path.exists(missing):
            made.insert(0, missing)
            missing = os.path.dirname(missing)
        if missing and not os.path.isdir(missing):
            return f"cannot be created: {missing} is not a directory"
        for new_dir in made:
            os.mkdir(new_dir)
        if directory:
            fd, probe = tempfile.mkstemp(prefix=".otel-rollout-probe-", dir=target)
            os.close(fd)
            os.unlink(probe)
        elif os.path.exists(target):
            with open(target, "a", encoding="utf-8"):
                pass
        else:
            with open(target, "x", encoding="utf-8"):
                pass
            made.append(target)
    except OSError as exc:
        where = "cannot be created" if made else "is not writable"
        return f"{where}: {exc.strerror or exc}"
    finally:
        for created in reversed(made):
            with contextlib.suppress(OSError):
                (os.rmdir if os.path.isdir(created) else os.unlink)(created)
    return None


def path_problems(config: RolloutConfig) -> list[Problem]:
    """Output paths where nothing can be written: a check for ``otel-rollout check``.

    Parsing never touches the filesystem (a worker may start before a shared volume is mounted);
    the check does, so a launcher learns before the run that no step log would be kept.
    """
    problems = []
    for env, value, directory in (
        ("OTEL_ROLLOUT_STEP_LOG", config.step_log, False),
        ("OTEL_ROLLOUT_REPORT_DIR", config.report_dir, True),
    ):
        if value is not None and (reason := _writable(value, directory=directory)) is not None:
            problems.append(Problem(env, value, reason, "(unset): nothing is written"))
    return problems


def describe(config: RolloutConfig) -> list[tuple[str, str, str]]:
    """(variable, effective value, meaning) rows, for ``otel-rollout check`` and
    docs/CONFIGURATION.md."""
    rows = [(s.env, s.render(getattr(config, s.attr)), s.doc) for s in SETTINGS]
    rows.append(
        (
            CAPTURE_CONTENT_ENV,
            str(config.capture_content).lower(),
            "Standard GenAI opt-in: record prompt and response text on spans.",
        )
    )
    rows.append(
        (
            SEMCONV_OPT_IN_ENV,
            ",".join(
                token
                for token, on in (
                    (GEN_AI_LATEST, config.gen_ai_latest),
                    (RL_LATEST, config.rl_latest),
                )
                if on
            )
            or "(unset)",
            f"Standard opt-in: {GEN_AI_LATEST} switches token metrics (and the cached-token "
            f"span attribute) to the GenAI conventions' newest names; {RL_LATEST} names the "
            "step and its phases as the proposed rl.* conventions do (docs/EMITS.md).",
        )
    )
    return rows
