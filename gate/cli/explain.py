"""`nodegate package explain DIR --config k=v,...`: what a package would do, without a node.

The package's own explain entry point (gate.agent.explain) computes it; this module reads the flags
and shows the result: a rich table on a terminal, plain columns in a pipe, or JSON with -o json.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from gate.cli.errors import CliError

if TYPE_CHECKING:
    from gate.agent.explain import Explanation


def parse_config(values: list[str]) -> dict[str, bytes]:
    """`--config a=1,b=2 --config c=3` as config; CliError names a malformed item."""
    from gate.agent.config import parse_assignments

    out: dict[str, bytes] = {}
    for value in values:
        try:
            out.update(parse_assignments(value))
        except ValueError as exc:
            raise CliError(f"--config wants key=value[,key=value...]: {exc}") from None
    return out


def render_plain(explanation: Explanation) -> str:
    columns, rows = explanation.columns, explanation.rows
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    lines = [explanation.title, ""] if explanation.title else []
    for cells in [columns, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip())
    if explanation.notes:
        lines += ["", "notes:", *(f"  {note}" for note in explanation.notes)]
    return "\n".join(lines) + "\n"


def render_rich(explanation: Explanation) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=explanation.title or None, title_justify="left", show_lines=False)
    last = len(explanation.columns) - 1
    for i, column in enumerate(explanation.columns):  # the last column (a source, a reason) wraps
        table.add_column(column, overflow="fold", no_wrap=i < last)
    for row in explanation.rows:
        table.add_row(*row)
    parts: list[Any] = [table]
    if explanation.notes:
        parts.append(Text("notes:", style="bold"))
        parts += [Text(f"  {note}") for note in explanation.notes]
    return Group(*parts)


def cmd_package_explain(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gate.agent.errors import PackageError
    from gate.agent.explain import ExplainRefused, explain_package, os_release_text

    config = parse_config(args.config)
    if args.cloud:
        config["cloud"] = args.cloud.encode()
    try:
        explanation = explain_package(Path(args.directory), config,
                                      os_release_text(args.os) if args.os else None)
    except PackageError as exc:
        raise CliError(str(exc)) from None
    except ExplainRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps({"title": explanation.title, "columns": explanation.columns, "rows": explanation.rows,
                          "notes": explanation.notes}, indent=2))
    elif sys.stdout.isatty():
        from rich.console import Console

        Console().print(render_rich(explanation))
    else:
        sys.stdout.write(render_plain(explanation))
    return 0


def add_parser(package_sub: Any) -> None:
    """`explain` under `nodegate package`."""
    explain = package_sub.add_parser(
        "explain", help="print what a package would do for a config, without a node (its explain entry point)")
    explain.add_argument("directory", metavar="DIR")
    explain.add_argument("--config", action="append", default=[], metavar="K=V[,K=V...]",
                         help="the gate's config for the package (repeatable)")
    explain.add_argument("--os", metavar="ID[:VERSION]",
                         help="the node's OS as its os-release ID says it (debian, ubuntu, rhel, amzn, cos, ...)")
    explain.add_argument("--cloud", help="shorthand for --config cloud=CLOUD")
    explain.add_argument("--output", "-o", choices=("table", "json"), default="table")
    explain.set_defaults(func=cmd_package_explain)
