"""What the vLLM adapter delivers on each vLLM release, as measured by tests/compat (issue #14).

One row per release family, one column per configuration users run. The value is the
``rollout.timing.source`` the request spans carry *today*: ``engine`` (vLLM's own
``RequestStateStats``, exact), ``engine_steps`` (the engine-core timestamps of the steps that
produced the first token and the finish, exact to one step), ``observed`` (what the caller saw:
for an offline batch every request gets the whole batch's start and end).

``GAPS`` names why a configuration is not exact on a release; tests/compat turns each into a
``pytest.mark.xfail(strict=True)``, so a fix in the adapter flips it and this table must follow.
"""

from __future__ import annotations

import time
from typing import Any

MS = 1_000_000

# configurations: offline LLM.generate with stats off (vLLM's default) / on, the same with n > 1,
# AsyncLLM.generate with stats on (AsyncEngineArgs' default) / off (verl's server).
CONFIGS = ("offline", "offline_stats", "offline_n", "offline_n_stats", "async_stats", "async")

SOURCES: dict[tuple[int, int], dict[str, str]] = {
    (0, 32): {
        "offline": "engine_steps",
        "offline_stats": "engine",
        "offline_n": "engine_steps",
        "offline_n_stats": "engine",
        "async_stats": "engine",
        "async": "engine_steps",
    },
    (0, 12): {
        "offline": "engine_steps",
        "offline_stats": "engine",
        "offline_n": "engine_steps",
        "offline_n_stats": "engine",
        "async_stats": "engine",
        "async": "engine_steps",
    },
    (0, 11): {
        "offline": "engine_steps",
        "offline_stats": "engine_steps",
        "offline_n": "engine_steps",
        "offline_n_stats": "engine_steps",
        "async_stats": "engine_steps",
        "async": "engine_steps",
    },
    (0, 10): {
        "offline": "engine_steps",
        "offline_stats": "engine_steps",
        "offline_n": "engine_steps",
        "offline_n_stats": "engine_steps",
        "async_stats": "engine_steps",
        "async": "engine_steps",
    },
}

_NO_METRICS = (
    "vLLM 0.10-0.11 never fill RequestOutput.metrics (output_processor.py "
    "_new_request_output passes no metrics): with stats on the adapter times requests by engine "
    "steps, as with stats off; vLLM's own per-request stamps are not there to compare with"
)
# "<config>" = exact timing; "<config>:tokens" = the output-token count; "<config>:stats" =
# vLLM's own RequestStateStats stamps, what the spans are compared with to 1 ms.
GAPS: dict[tuple[int, int], dict[str, str]] = {
    (0, 32): {},
    (0, 12): {},
    (0, 11): {"offline_stats:stats": _NO_METRICS, "offline_n_stats:stats": _NO_METRICS},
    (0, 10): {"offline_stats:stats": _NO_METRICS, "offline_n_stats:stats": _NO_METRICS},
}


def family(version: str) -> tuple[int, int]:
    """The matrix row of a vLLM version string (``0.12.0``, ``0.11.0+cpu`` ...)."""
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return major, minor


def row(version: str) -> tuple[dict[str, str], dict[str, str]]:
    """(sources, gaps) for ``version``; a release outside the matrix fails loudly."""
    key = family(version)
    if key not in SOURCES:
        raise LookupError(f"vLLM {version} is not in the compat matrix: measure it and add a row")
    return SOURCES[key], GAPS[key]


def wall_offset_ns() -> int:
    """Epoch minus monotonic now: vLLM's ``*_ts`` stamps are monotonic, system-wide on Linux."""
    return time.time_ns() - time.monotonic_ns()


def assert_engine_stamps(span: Any, stats: Any, offset_ns: int) -> None:
    """A span's start, first-token event and end are vLLM's own stamps, within 1 ms.

    ``arrival_time`` is wall clock; ``first_token_ts``/``last_token_ts`` are the engine core's
    monotonic step stamps (compared directly, not through ``first_token_latency``, which the
    front end computes when it *handles* the step: behind by the output handler's lag).
    """
    assert abs(span.start_time - stats.arrival_time * 1e9) <= MS
    assert abs(span.end_time - (stats.last_token_ts * 1e9 + offset_ns)) <= MS
    (event,) = [e for e in span.events if e.name == "gen_ai.first_token"]
    assert abs(event.timestamp - (stats.first_token_ts * 1e9 + offset_ns)) <= MS


CONFIG_LABELS = {
    "offline": "`LLM()` (stats off, vLLM's default)",
    "offline_stats": "`LLM(disable_log_stats=False)`",
    "offline_n": "`LLM()`, `n > 1`",
    "offline_n_stats": "`LLM(disable_log_stats=False)`, `n > 1`",
    "async_stats": "`AsyncLLM` (stats on, its default)",
    "async": "`AsyncLLM(disable_log_stats=True)` (verl's server)",
}
RELEASE_LABELS = {
    (0, 32): "0.32.0",
    (0, 12): "0.12.0",
    (0, 11): "0.11.0",
    (0, 10): "0.10.x (by source)",
}
"""The releases as the compat suites run them (0.10 cannot run here: it is read from source)."""


def _cell(release: tuple[int, int], config: str) -> str:
    source = SOURCES[release][config]
    compared = (
        source == "engine"
        and "_n" not in config
        and f"{config}:stats" not in GAPS[release]
        and release != (0, 10)
    )
    return f"{source} (±1 ms)" if compared else source


def markdown_table() -> str:
    """docs/ENGINES.md's version × timing table: ``rollout.timing.source`` per configuration and
    release, "(±1 ms)" where tests/compat compared each span with vLLM's own stamps."""
    releases = list(RELEASE_LABELS)
    lines = [
        "| configuration | " + " | ".join(RELEASE_LABELS[r] for r in releases) + " |",
        "|---|" + "---|" * len(releases),
    ]
    for config in CONFIGS:
        cells = " | ".join(_cell(r, config) for r in releases)
        lines.append(f"| {CONFIG_LABELS[config]} | {cells} |")
    return "\n".join(lines) + "\n"
