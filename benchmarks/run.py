"""Run the benchmarks: ``--smoke`` for CI (tiny sizes, < 60 s, fails only if a script breaks),
or the full run, which writes ``benchmarks/results.json`` and the table in ``benchmarks/README.md``.

    VPY=$(scripts/engine-env vllm)/bin/python; export MODEL=$(scripts/tiny-model)
    $VPY benchmarks/run.py --smoke            # CI
    $VPY benchmarks/run.py                    # everything (~15-20 min on 2 cores)
    $VPY benchmarks/run.py --only cost,scale  # some of: cost scale memory engine export engine_figures sampling

The full run starts each benchmark in a fresh process (one global OTel provider per process,
clean RSS for the memory figure, AsyncLLM needs a ``__main__`` file). Missing a goal never makes
the exit status non-zero; a benchmark that raises does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
ALL = ("cost", "scale", "memory", "engine", "export", "engine_figures", "sampling")
MIB = 2**20


def smoke(with_engine: bool) -> int:
    """Everything engine-free in this one process (one vLLM import), export children fake."""
    import _common as C
    import bench_cost
    import bench_engine_figures
    import bench_exit
    import bench_export
    import bench_http
    import bench_memory
    import bench_sampling
    import bench_scale
    import bench_step_end

    failures = 0
    t0 = time.monotonic()
    steps: list[tuple[str, Any]] = [
        ("cost", lambda: bench_cost.run(True)),
        ("scale", lambda: bench_scale.run(True)),
        ("memory", lambda: bench_memory.run(True)),
        ("export", lambda: bench_export.run(True)),
        ("http", lambda: bench_http.run(True)),
        ("exit", lambda: bench_exit.run(True)),
        ("engine_figures", lambda: bench_engine_figures.run(True)),
        ("sampling", lambda: bench_sampling.run(True)),
        ("step_end", lambda: bench_step_end.run(True)),
    ]
    for name, fn in steps:
        start = time.monotonic()
        try:
            fn()
            print(f"[smoke] {name}: ok ({time.monotonic() - start:.1f} s)", flush=True)
        except Exception:
            traceback.print_exc()
            print(f"[smoke] {name}: FAILED", flush=True)
            failures += 1
    if with_engine:  # a separate process: the engine wants its own SDK setup (batch processor)
        rc = subprocess.run(
            [sys.executable, str(HERE / "bench_engine.py"), "--smoke", "--mode", "offline"],
            stdout=subprocess.DEVNULL,
        ).returncode
        print(f"[smoke] engine: {'ok' if rc == 0 else 'FAILED'}", flush=True)
        failures += rc != 0
    print(
        f"[smoke] {len(steps) - failures} ok, {failures} failed in "
        f"{time.monotonic() - t0:.1f} s; load {os.getloadavg()}",
        flush=True,
    )
    del C
    return 1 if failures else 0


def full(only: list[str], out: Path) -> int:
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    results.setdefault("runs", {})
    failures = 0
    for name in only:
        tmp = HERE / f".{name}.json"
        cmd = [sys.executable, str(HERE / f"bench_{name}.py"), "--out", str(tmp)]
        load = os.getloadavg()
        start = time.monotonic()
        print(f"[run] {name}: {' '.join(cmd[1:])} (load {load[0]:.2f})", flush=True)
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        if proc.returncode != 0 or not tmp.exists():
            print(f"[run] {name}: FAILED (rc={proc.returncode})", flush=True)
            failures += 1
            continue
        res = json.loads(tmp.read_text())
        tmp.unlink()
        res["wall_s"] = round(time.monotonic() - start, 1)
        res["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        res["command"] = f"$VPY benchmarks/run.py --only {name}"
        results["runs"][name] = res
        out.write_text(json.dumps(results, indent=2))
        print(f"[run] {name}: done in {res['wall_s']} s", flush=True)
    write_table(results, HERE / "README.md")
    return 1 if failures else 0


# --- the README table ---------------------------------------------------------------------------


def _b(band: dict[str, float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(band['median'])} ({fmt.format(band['min'])}–{fmt.format(band['max'])})"


def _goal(ok: bool) -> str:
    return "met" if ok else "**missed**"


def rows(results: dict[str, Any]) -> list[list[str]]:
    runs = results.get("runs", {})
    out: list[list[str]] = []

    def meta(r: dict[str, Any]) -> str:
        m = r["machine"]
        return (
            f"{m['date']}, load {m['loadavg_start'][0]:.1f}→{r.get('loadavg_end', ['?'])[0]}, "
            f"commit {m.get('commit', '?')}"
        )

    if "cost" in runs:
        r = runs["cost"]
        for key, label in (
            ("offline_stats_on", "offline, engine stats on"),
            ("offline_stats_off", "offline, engine stats off (default)"),
            ("async_stream", "async stream, 16 chunks"),
        ):
            c = r[key]
            if "inline_us" not in c:  # results of a run before the background emitter
                out.append(
                    [
                        f"1. per-request CPU, {label}",
                        f"ours {_b(c['ours_us'], '{:.1f}')} µs, floor "
                        f"{_b(c['floor_us'], '{:.1f}')} µs",
                        f"{_b(c['ratio'])}× floor",
                        "≤ 1.3×",
                        _goal(c["ratio"]["median"] <= 1.3),
                        meta(r),
                    ]
                )
                continue
            out.append(
                [
                    f"1. per-request CPU (process, emitter included), {label}",
                    f"background {_b(c['ours_us'], '{:.1f}')} µs (caller "
                    f"{c['caller_us']['median']:.1f}), inline {_b(c['inline_us'], '{:.1f}')}"
                    f" µs, floor {_b(c['floor_us'], '{:.1f}')} µs",
                    f"{_b(c['ratio'])}× floor (inline {_b(c['inline_ratio'])}×)",
                    "≤ 1.3×",
                    _goal(c["ratio"]["median"] <= 1.3),
                    meta(r),
                ]
            )
    if "engine" in runs:
        r = runs["engine"]
        for key, label in (("offline", "LLM.generate"), ("async", "AsyncLLM streams")):
            if key not in r:
                continue
            c = r[key]
            out.append(
                [
                    f"2. real vLLM, {label}, {c['requests']} req / {c['tokens']} tok, "
                    f"{c['pairs']} pairs",
                    f"instr {_b(c['instrumented_s'], '{:.3f}')} s, bare "
                    f"{_b(c['bare_s'], '{:.3f}')} s",
                    f"{_b(c['ratio'], '{:.3f}')} (median of pair ratios)",
                    "≤ 1.01",
                    _goal(c["ratio"]["median"] <= 1.01),
                    meta(r),
                ]
            )
        big = r.get("offline", {}).get("generate_10k")
        if big:
            out.append(
                [
                    "3. real vLLM, one generate of 10,000 prompts: post-return phase"
                    + (f", median of {big['reps']} per side" if "reps" in big else ""),
                    f"instr {_b(big['instrumented']['post_return_band_ms'], '{:.1f}')} ms, "
                    f"bare {big['bare']['post_return_ms']} ms"
                    if "post_return_band_ms" in big["instrumented"]
                    else f"instr {big['instrumented']['post_return_ms']} ms, bare "
                    f"{big['bare']['post_return_ms']} ms",
                    f"+{big['post_return_added_ms']} ms",
                    "≤ 150 ms",
                    _goal(big["post_return_added_ms"] <= 150),
                    meta(r),
                ]
            )
    if "scale" in runs:
        r = runs["scale"]
        per = {}
        for n, c in r["sizes"].items():
            if "caller_visible_ms" not in c:  # results of a run before the background emitter
                continue
            u = c["us_per_request"]
            per[n] = u["caller_cpu"]  # CPU: on a shared machine wall time counts others' work
            out.append(
                [
                    f"3. caller-visible post-return time, {int(n):,} requests (engine-free)",
                    f"background {_b(c['caller_visible_ms'], '{:.1f}')} ms (emitter done "
                    f"after {c['emitter_done_after_ms']['median']:.0f} ms, total CPU "
                    f"{c['total_cpu_ms']['median']:.0f} ms); inline "
                    f"{_b(c['inline_ms'], '{:.0f}')} ms; floor {_b(c['floor_ms'], '{:.0f}')} ms",
                    f"{u['caller']} µs/req (inline {u['inline']}, floor {u['floor']})",
                    "≤ 15 µs/req",
                    _goal(u["caller"] <= 15),
                    meta(r),
                ]
            )
        if per:
            values = list(per.values())
            growth = round(values[-1] / values[0], 2)
            out.append(
                [
                    f"3. growth {list(per)[0]} → {list(per)[-1]} requests",
                    "caller CPU µs/request, last / first",
                    f"{growth}×",
                    "linear (≈ 1×)",
                    _goal(growth <= 1.3),
                    meta(r),
                ]
            )
    if "memory" in runs:
        r = runs["memory"]
        out.append(
            [
                f"4. RSS growth over {r['requests']:,} requests (all stream endings)",
                f"samples {r['rss_samples_growth_mib']} MiB; live per-request objects "
                f"{r['live_per_request_objects'] or 'none'}; in-flight after "
                f"{r['in_flight_gauge_after']}",
                f"{r['rss_growth_mib']} MiB",
                "< 2 MiB",
                _goal(r["rss_growth_mib"] < 2 and not r["live_per_request_objects"]),
                meta(r),
            ]
        )
    if "export" in runs:
        r = runs["export"]
        for name, c in r["configs"].items():
            if name == "bare":
                continue
            ratio = c.get("generate_ratio_vs_healthy")
            out.append(
                [
                    f"5. OTLP {name} ({r['engine']}, {r['requests']} req × {r['runs']})",
                    f"generate {c['median_generate_s']} s; exit {c['exit_s']} s "
                    f"(bare {r['configs']['bare']['exit_s']} s)",
                    f"latency ×{ratio}; exit +{c['exit_beyond_bare_s']} s",
                    "exit ≤ +2 s",
                    _goal(c["exit_beyond_bare_s"] <= 2),
                    meta(r),
                ]
            )
    return out


def write_table(results: dict[str, Any], readme: Path) -> None:
    header = ["figure", "measured", "result (median, min–max)", "goal", "", "when / load / commit"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows(results):
        lines.append("| " + " | ".join(row) + " |")
    machine = next(iter(results.get("runs", {}).values()), {}).get("machine", {})
    lines.append("")
    lines.append(
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cpus', '?')} cores, "
        f"{machine.get('mem_gib', '?')} GiB, Python {machine.get('python', '?')}, "
        f"OTel SDK {machine.get('opentelemetry_sdk', '?')}, vLLM "
        f"{machine.get('vllm', '?')} (CPU). Raw figures: `benchmarks/results.json`."
    )
    table = "\n".join(lines)
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    text = readme.read_text() if readme.exists() else f"# Benchmarks\n\n{begin}\n{end}\n"
    if begin not in text:
        text += f"\n{begin}\n{end}\n"
    pre, rest = text.split(begin, 1)
    post = rest.split(end, 1)[1]
    readme.write_text(f"{pre}{begin}\n{table}\n{end}{post}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes for CI")
    ap.add_argument(
        "--with-engine",
        action="store_true",
        help="with --smoke: also a tiny real LLM.generate A/B (adds ~30 s)",
    )
    ap.add_argument("--only", default=",".join(ALL), help="comma-separated subset")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    ap.add_argument("--table-only", action="store_true", help="re-render README from results.json")
    args = ap.parse_args()
    if args.smoke:
        sys.exit(smoke(args.with_engine))
    if args.table_only:
        write_table(json.loads(Path(args.out).read_text()), HERE / "README.md")
        return
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(only) - set(ALL)
    if unknown:
        ap.error(f"unknown benchmarks: {sorted(unknown)}")
    sys.exit(full(only, Path(args.out)))


if __name__ == "__main__":
    main()
