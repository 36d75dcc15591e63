"""`make test-matrix`: the integration core against each Kubernetes release NodeGate claims.

CI runs every test on the one release pinned in versions.toml. This runs the core of the integration
tier (the control plane itself, admission, the per-node lifecycle, the rollout, GitOps health and the
chart install) once per release of `[matrix] kubernetes` in versions.toml, each on a control plane
built from that release (`NODEGATE_KUBE_VERSION`, gate/devcluster/build.py: its own cache directory,
built once per machine), and prints a table: release, tests passed / failed, time.

Not part of `make test`: each release costs a build of several CPU-minutes the first time and a
few minutes of tests every time. `KUBE_VERSIONS="v1.34.4 v1.33.13"` runs a subset (or another list);
`MATRIX_TESTS` replaces the test selection. The table goes to stdout and to `--report FILE`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from gate.devcluster import build

REPO = Path(__file__).resolve().parents[2]
# The integration core: one pytest session (one control plane) per release, in `make test`'s order
# (the chart's install before the integration tier registers the dev webhook under the same name).
CORE_TESTS = (
    "tests/chart/test_install.py",
    "tests/integration/test_control_plane.py",
    "tests/integration/admission",
    "tests/integration/operator/test_lifecycle.py",
    "tests/integration/operator/test_rollout.py",
    "tests/integration/operator/test_gitops_health.py",
)


@dataclass
class Row:
    version: str
    build: str = "-"
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    note: str = ""

    @property
    def verdict(self) -> str:
        if self.note:
            return "not run"
        return "passed" if self.failed == 0 and self.passed > 0 else "FAILED"


def matrix_versions(environ: dict[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    if env.get("KUBE_VERSIONS", "").strip():
        return env["KUBE_VERSIONS"].split()
    return list(tomllib.loads(build.VERSIONS_FILE.read_text())["matrix"]["kubernetes"])


def _counts(junit: Path) -> tuple[int, int, int]:
    """passed, failed (failures and errors), skipped from pytest's JUnit XML."""
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - failed - skipped, failed, skipped


def run_release(version: str, tests: list[str], logs: Path) -> Row:
    row = Row(version)
    env = {**os.environ, build.KUBE_VERSION_ENV: version}
    started = time.monotonic()
    try:
        component = build.load_components(environ=env)["kubernetes"]
        cached = build.is_built(component)
        build.build(component, progress=lambda m: print(m, file=sys.stderr, flush=True))
        row.build = "cached" if cached else f"{time.monotonic() - started:.0f}s"
    except build.BuildError as exc:
        row.note = f"build failed: {str(exc).splitlines()[0]}"
        return row
    junit = logs / f"{version}.xml"
    log = logs / f"{version}.log"
    print(f"Running {len(tests)} test paths on Kubernetes {version} (log: {log})", file=sys.stderr, flush=True)
    started = time.monotonic()
    with open(log, "w") as out:
        code = subprocess.call([sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider",
                                f"--junitxml={junit}"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    row.seconds = time.monotonic() - started
    if not junit.exists():
        row.note = f"pytest exited {code} without a report; see {log}"
        return row
    row.passed, row.failed, row.skipped = _counts(junit)
    return row


def table(rows: list[Row]) -> str:
    lines = [f"{'Kubernetes':<12} {'build':>8} {'passed':>7} {'failed':>7} {'skipped':>8} {'time':>8}  result",
             "-" * 64]
    for r in rows:
        lines.append(f"{r.version:<12} {r.build:>8} {r.passed:>7} {r.failed:>7} {r.skipped:>8} "
                     f"{r.seconds:>7.0f}s  {r.verdict}" + (f" ({r.note})" if r.note else ""))
    passed = sum(1 for r in rows if r.verdict == "passed")
    lines.append(f"{passed} of {len(rows)} releases passed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - `make test-matrix`
    parser = argparse.ArgumentParser(prog="python -m gate.devcluster.matrix", description=__doc__.split("\n")[0])
    parser.add_argument("--report", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    tests = os.environ.get("MATRIX_TESTS", "").split() or list(CORE_TESTS)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="nodegate-matrix-") as tmp:
        logs = Path(os.environ.get("MATRIX_LOGS") or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        for version in matrix_versions():
            rows.append(run_release(version, tests, logs))
            print(table(rows), file=sys.stderr, flush=True)
    report = table(rows)
    print(report)
    if args.report:
        args.report.write_text(report + "\n")
    return 0 if all(r.verdict == "passed" for r in rows) else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
