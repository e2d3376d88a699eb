"""``otel-rollout``: check the configuration, render step reports."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from otel_rollout.config import describe, load_config, path_problems


def _check(_: argparse.Namespace) -> int:
    config = load_config(warn=False)
    width = max(len(name) for name, _, _ in describe(config))
    for name, value, doc in describe(config):
        print(f"{name:<{width}}  {value}\n{'':<{width}}  {doc}")
    problems = [*config.problems, *path_problems(config)]
    for problem in problems:
        print(f"error: {problem.message()}", file=sys.stderr)
    if problems:
        names = ", ".join(p.variable for p in problems)
        print(f"invalid configuration: {names}", file=sys.stderr)
        return 1
    print("configuration ok")
    return 0


def _report(args: argparse.Namespace) -> int:
    from otel_rollout.reports import png

    written = png.render_log(args.step_log, args.output, steps=args.step)
    for path in written:
        print(path)
    if not written:
        print(f"no steps found in {args.step_log}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="otel-rollout", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser(
        "check",
        help="print the effective OTEL_ROLLOUT_* configuration; exit 1 if any value is invalid",
    )
    check.set_defaults(func=_check)
    rep = sub.add_parser("report", help="render a PNG per step from an OTEL_ROLLOUT_STEP_LOG file")
    rep.add_argument("step_log", help="JSON-lines file written with OTEL_ROLLOUT_STEP_LOG")
    rep.add_argument("-o", "--output", default=".", help="directory for the PNG files")
    rep.add_argument("--step", type=int, action="append", help="only this step (repeatable)")
    rep.set_defaults(func=_report)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
