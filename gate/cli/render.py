"""How reports look: plain text (pipes, logs, CI), rich (a terminal), and data (-o json|yaml). Pure.

Every function here takes finished reports and returns text, a rich renderable or plain data; nothing
reads the cluster or the clock, so the output is a function of its input and unit tests pin it down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gate.api.nodegate import ImageRecord
from gate.api.policy import DEFAULT_COMPARTMENT
from gate.cli.report import ActiveNode, CompartmentReport, FailedNode, GateReport, WaitGroup
from gate.rollout import Simulation

BAR_WIDTH = 30
PLAIN_MARKS = ("#", ">", "!", ".")  # complete, in progress, failed, waiting
RICH_STYLES = ("green", "yellow", "red", "grey50")
RICH_MARKS = ("█", "▓", "╳", "░")  # distinct without colour too
LIST_LIMIT = 15  # nodes listed per section before "... and N more"
SUMMARY_STYLE = {"Ready": "bold green", "Progressing": "bold yellow", "Degraded": "bold red", "Paused": "bold blue"}
STATE_STYLE = {"complete": "green", "rolling": "yellow", "stopped": "bold red", "waiting": "default",
               "outside-window": "blue"}


def bar_segments(counts: Sequence[int], width: int = BAR_WIDTH) -> list[int]:
    """Split `width` characters among `counts` in proportion (largest remainder). Every non-zero count
    gets at least one character while there are characters to give, so a single failed node among
    thousands still shows. Returns all zeros when every count is zero."""
    total = sum(counts)
    if total <= 0 or width <= 0:
        return [0] * len(counts)
    shares = [c * width / total for c in counts]
    sizes = [int(s) for s in shares]
    for i, c in enumerate(counts):
        if c > 0 and sizes[i] == 0:
            sizes[i] = 1
    # Take back from the largest while over (never a count's last character while another has more
    # than one), then give to the largest remainders while under.
    while sum(sizes) > width:
        spare = [k for k in range(len(sizes)) if sizes[k] > 1] or [k for k in range(len(sizes)) if sizes[k] > 0]
        sizes[max(spare, key=lambda k: sizes[k])] -= 1
    order = sorted(range(len(counts)), key=lambda k: shares[k] - int(shares[k]), reverse=True)
    k = 0
    while sum(sizes) < width:
        i = order[k % len(order)]
        if counts[i] > 0:
            sizes[i] += 1
        k += 1
    return sizes


def _counts(c: CompartmentReport) -> list[int]:
    return [c.complete, c.in_progress, c.failed, c.waiting]


def plain_bar(c: CompartmentReport, width: int = BAR_WIDTH) -> str:
    sizes = bar_segments(_counts(c), width)
    body = "".join(mark * n for mark, n in zip(PLAIN_MARKS, sizes, strict=True)) if c.matched else " " * width
    return f"[{body}]"


def rich_bar(c: CompartmentReport, width: int = BAR_WIDTH) -> Text:
    sizes = bar_segments(_counts(c), width)
    text = Text()
    if not c.matched:
        return Text(" " * width)
    for mark, style, n in zip(RICH_MARKS, RICH_STYLES, sizes, strict=True):
        if n:
            text.append(mark * n, style=style)
    return text


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def batch_text(c: CompartmentReport) -> str:
    """The batch running now, or the one planned next (`batch` in the status is the next number
    between batches)."""
    if c.batch <= 0 or c.state == "complete" or c.matched == 0:
        return "-"
    size = f" (size {c.batch_size})" if c.batch_size else ""
    return f"{c.batch}{size}" if c.in_progress else f"next {c.batch}{size}"


def headline(r: GateReport) -> str:
    parts = [f"NodeGate {r.name}", r.summary, f"{r.complete}/{r.matched} complete"]
    if r.policy:
        parts.append(f"policy {r.policy}")
    if r.paused:
        parts.append("paused")
    parts.append(f"generation {r.generation}")
    return "  ".join(parts)


def _wait_nodes(w: WaitGroup) -> str:
    n = len(w.nodes)
    if n <= 3:
        return f"{n} node{'s' if n != 1 else ''} ({', '.join(w.nodes)})"
    return f"{n} nodes"


def _more(total: int, shown: int, gate: str) -> str:
    return f"... and {total - shown} more (`nodegate node list --gate {gate}`)"


# -- plain text ----------------------------------------------------------------------------------


def render_text(reports: Sequence[GateReport], *, durations: bool = True, limit: int = LIST_LIMIT) -> str:
    """Plain text for pipes and logs. `durations=False` leaves out the clock-driven parts, so two
    renderings compare equal exactly when something changed (what `--watch` prints on)."""
    if not reports:
        return "No NodeGates.\n"
    return "\n".join(_gate_text(r, durations, limit) for r in reports)


def _gate_text(r: GateReport, durations: bool, limit: int) -> str:
    lines = [headline(r)]
    lines += [f"  ! {note}" for note in r.notes]
    if r.compartments:
        rows = [("COMPARTMENT", "PROGRESS", "DONE", "RUN", "FAIL", "WAIT", "CEILING", "BATCH", "STATE")]
        for c in r.compartments:
            rows.append((c.name, plain_bar(c), f"{c.complete}/{c.matched}", str(c.in_progress), str(c.failed),
                         str(c.waiting), str(c.ceiling), batch_text(c), c.state))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        right = {2, 3, 4, 5, 6}
        for row in rows:
            cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
            lines.append("  " + "  ".join(cells).rstrip())
        lines.append("  (# complete  > in progress  ! failed  . waiting)")
    if r.active:
        lines.append(f"  In progress ({len(r.active)}):")
        active = [(a.compartment, a.name, f"batch {a.batch}  {a.doing}" + (_times(a) if durations else ""))
                  for a in r.active[:limit]]
        lines += _aligned(active)
        if len(r.active) > limit:
            lines.append("    " + _more(len(r.active), limit, r.name))
    if r.failed:
        lines.append(f"  Failed ({len(r.failed)}):")
        lines += _aligned([(f.compartment, f.name, _failure(f)) for f in r.failed[:limit]])
        if len(r.failed) > limit:
            lines.append("    " + _more(len(r.failed), limit, r.name))
    if r.waits:
        lines.append("  Waiting:")
        lines += _aligned([(w.compartment, _wait_nodes(w), f"{w.reason}: {w.message}") for w in r.waits])
    if r.images:
        lines.append("  Images (resolved for this rollout):")
        lines += _aligned([_image_row(i) for i in r.images])
    return "\n".join(lines) + "\n"


def _image_row(record: ImageRecord) -> tuple[str, str, str]:
    """A package, its tag and the digest its stage pods pull (-o yaml shows the digest whole)."""
    algorithm, _, hexdigits = record.digest.partition(":")
    return record.package, record.reference, f"{algorithm}:{hexdigits[:12]}"


def _aligned(rows: Sequence[tuple[str, str, str]]) -> list[str]:
    """Rows of (compartment, what, detail), the first two columns padded to line up."""
    first = max((len(r[0]) for r in rows), default=0)
    second = max((len(r[1]) for r in rows), default=0)
    return [f"    {(c.ljust(first) + '  ') if first else ''}{what.ljust(second)}  {detail}" for c, what, detail in rows]


def _failure(f: FailedNode) -> str:
    text = f"{f.where}: {f.reason}"
    if f.message:
        text += f": {f.message}"
    if f.cordoned:
        text += " (still cordoned by NodeGate)"
    return text


# -- rich ----------------------------------------------------------------------------------------


def render_rich(reports: Sequence[GateReport], *, limit: int = LIST_LIMIT) -> RenderableType:
    if not reports:
        return Text("No NodeGates.")
    return Group(*(_gate_rich(r, limit) for r in reports))


def _gate_rich(r: GateReport, limit: int) -> RenderableType:
    parts: list[RenderableType] = []
    for note in r.notes:
        parts.append(Text(f"! {note}", style="red" if note.startswith(("degraded", "DeploymentPolicy")) else "yellow"))
    if r.compartments:
        table = Table(box=None, pad_edge=False, expand=False, header_style="bold")
        for name, justify in (("Compartment", "left"), ("Progress", "left"), ("Done", "right"), ("Running", "right"),
                              ("Failed", "right"), ("Waiting", "right"), ("Ceiling", "right"), ("Batch", "left"),
                              ("State", "left")):
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for c in r.compartments:
            table.add_row(c.name, rich_bar(c), f"{c.complete}/{c.matched}", str(c.in_progress),
                          Text(str(c.failed), style="red" if c.failed else ""), str(c.waiting), str(c.ceiling),
                          batch_text(c), Text(c.state, style=STATE_STYLE.get(c.state, "")))
        parts.append(table)
    if r.active:
        parts.append(_section(f"In progress ({len(r.active)})", "yellow",
                              [_active_row(a) for a in r.active[:limit]], len(r.active), r.name))
    if r.failed:
        parts.append(_section(f"Failed ({len(r.failed)})", "red",
                              [(f.compartment, f.name, _failure(f)) for f in r.failed[:limit]],
                              len(r.failed), r.name))
    if r.waits:
        parts.append(_section("Waiting", "grey50",
                              [(w.compartment, _wait_nodes(w), f"{w.reason}: {w.message}") for w in r.waits],
                              len(r.waits), r.name))
    if r.images:
        parts.append(_section("Images (resolved for this rollout)", "cyan", [_image_row(i) for i in r.images],
                              len(r.images), r.name))
    title = Text.assemble((f"NodeGate {r.name}", "bold"), "  ", (r.summary, SUMMARY_STYLE.get(r.summary, "")),
                          f"  {r.complete}/{r.matched} complete")
    subtitle = "  ".join(x for x in (f"policy {r.policy}" if r.policy else "", "paused" if r.paused else "",
                                     f"generation {r.generation}") if x)
    return Panel(Group(*parts) if parts else Text("No nodes match."), title=title, title_align="left",
                 subtitle=subtitle, subtitle_align="right", expand=False)


def _active_row(a: ActiveNode) -> tuple[str, str, str]:
    return a.compartment, a.name, f"batch {a.batch}  {a.doing}{_times(a)}"


def _times(a: ActiveNode) -> str:
    """How long the node is in its phase, and in a soak how long is left."""
    text = f"  for {duration(a.seconds)}"
    if a.soak_left is not None:
        text += f", soak left {duration(a.soak_left)}"
    return text


def _section(title: str, style: str, rows: list[tuple[str, str, str]], total: int, gate: str) -> RenderableType:
    table = Table(box=None, show_header=False, pad_edge=False, title=title, title_justify="left",
                  title_style=f"bold {style}")
    table.add_column("compartment", style="dim")
    table.add_column("what", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for row in rows:
        table.add_row(*row)
    if total > len(rows):
        table.add_row("", "", _more(total, len(rows), gate))
    return table


# -- data ----------------------------------------------------------------------------------------


def report_data(r: GateReport) -> dict[str, Any]:
    """The report as plain data with camelCase keys, for -o json|yaml."""
    return {
        "name": r.name, "status": r.summary, "matched": r.matched, "complete": r.complete,
        "generation": r.generation, "observedGeneration": r.observed_generation, "deploymentPolicy": r.policy,
        "paused": r.paused, "notes": list(r.notes), "heldForHandOff": list(r.held),
        "compartments": [{
            "name": c.name, "matched": c.matched, "complete": c.complete, "inProgress": c.in_progress,
            "failed": c.failed, "waiting": c.waiting, "ceiling": c.ceiling, "batch": c.batch,
            "batchSize": c.batch_size, "consecutiveFailures": c.consecutive_failures, "state": c.state,
        } for c in r.compartments],
        "inProgress": [{"node": a.name, "compartment": a.compartment, "batch": a.batch, "phase": a.phase,
                        "secondsInPhase": None if a.seconds is None else round(a.seconds, 1),
                        "running": list(a.running), "detail": a.detail,
                        "soakLeftSeconds": None if a.soak_left is None else round(a.soak_left, 1)}
                       for a in r.active],
        "failed": [{"node": f.name, "compartment": f.compartment, "package": f.package, "stage": f.stage,
                    "reason": f.reason, "message": f.message, "cordoned": f.cordoned} for f in r.failed],
        "waiting": [{"compartment": w.compartment, "reason": w.reason, "message": w.message, "nodes": list(w.nodes)}
                    for w in r.waits],
        "images": [{"package": i.package, "reference": i.reference, "digest": i.digest} for i in r.images],
    }


# -- plan ----------------------------------------------------------------------------------------

PLAN_NOTE = ("Assumes every node succeeds; windows, a pause and a stop are treated as lifted, "
             "higher-priority gates as complete.")


def plan_text(sim: Simulation, policy: str | None, *, names_per_line: int = 6,
              soaking: Mapping[str, float] | None = None) -> str:
    """`soaking`: seconds of soak left per soaking node, shown under its batch."""
    head = f"Plan of NodeGate {sim.gate}" + (f" (policy {policy})" if policy else "") + ":"
    lines = [head, f"  {PLAN_NOTE}"]
    for c in sim.compartments:
        if c.name == DEFAULT_COMPARTMENT and policy and not c.matched:
            continue  # a policy's catch-all with no nodes is noise
        extra = f"; stopped: shown as it runs after `nodegate resume {sim.gate}`" if c.stopped else ""
        lines.append(f"  {c.name}: {c.matched} nodes, at most {c.ceiling} at once, "
                     f"{len(c.batches)} batches{extra}")
        for b in c.batches:
            shown = ", ".join(b.nodes[:names_per_line])
            if len(b.nodes) > names_per_line:
                shown += f", +{len(b.nodes) - names_per_line} more"
            lines.append(f"    batch {b.number:<3} {b.phase:<8} {len(b.nodes):>4}  {shown}")
            soaks = [f"{n} {duration(soaking[n])}" for n in b.nodes if soaking and n in soaking]
            if soaks:
                lines.append(f"              soak left: {', '.join(soaks)}")
        if c.unplanned:
            lines.append(f"    never reached: {len(c.unplanned)} nodes (failed nodes still cordoned fill the budget)")
    return "\n".join(lines) + "\n"


def plan_data(sim: Simulation, policy: str | None, soaking: Mapping[str, float] | None = None) -> dict[str, Any]:
    soaks = soaking or {}
    return {
        "gate": sim.gate, "deploymentPolicy": policy, "assumptions": PLAN_NOTE,
        "compartments": [{
            "name": c.name, "matched": c.matched, "ceiling": c.ceiling, "stopped": c.stopped,
            "batches": [{"number": b.number, "phase": b.phase, "nodes": list(b.nodes),
                         "soakLeftSeconds": {n: round(soaks[n], 1) for n in b.nodes if n in soaks}}
                        for b in c.batches],
            "unplanned": list(c.unplanned),
        } for c in sim.compartments],
    }
