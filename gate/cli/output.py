"""How the cluster commands write results that are not reports: data for `-o json|yaml`, plain tables.

Reports have their own renderer (`gate.cli.render`); this is what `plan -o`, `status -o` and
`node list` share. A table is what `kubectl get` prints: left-aligned columns, two spaces apart.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml


def print_data(data: Any, output: str, out: TextIO | None = None) -> None:
    """`data` as JSON (output "json") or YAML (anything else), in the order it was built."""
    out = out or sys.stdout
    if output == "json":
        out.write(json.dumps(data, indent=2) + "\n")
    else:
        out.write(yaml.safe_dump(data, sort_keys=False))


def table(rows: Sequence[Sequence[str]]) -> str:
    """Rows (the first is the header) as aligned columns, each line without trailing blanks."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows) + "\n"
