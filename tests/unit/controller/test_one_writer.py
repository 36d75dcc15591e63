"""The house rule of `gate.controller.executor`: on a gate or node reconcile's path, only the appliers
call a write verb of the Kubernetes client (or emit an Event). An AST walk over `gate/controller`
finds every such call, and names the module, line and function of each one outside the appliers."""

from __future__ import annotations

import ast
from pathlib import Path

import gate.controller

CONTROLLER = Path(gate.controller.__file__).parent
WRITE_VERBS = frozenset({"create", "patch", "delete", "replace", "update", "apply", "post", "put"})
APPLIERS = frozenset({"executor.py", "gate_applier.py", "node_applier.py"})
# Writers that are no part of a gate or node reconcile, each the one writer of its own kind.
OTHER_WRITERS = {
    ("events.py", "EventRecorder.emit"): "the Event channel every applier emits through",
    ("gates.py", "PolicyReconciler.reconcile"): "a DeploymentPolicy's own status",
    ("history.py", "HistoryReconciler.reconcile"): "the gate's ControllerRevisions",
    ("history.py", "HistoryReconciler._create"): "the gate's ControllerRevisions",
    ("operator.py", "Operator._sign_records"): "records signed when this replica first leads, before any reconcile",
    ("signing.py", "load_or_create"): "the record signing key's Secret, at start-up",
    ("signing.py", "adoption_done"): "the record signing key's Secret, once records are adopted",
}


def _receiver(node: ast.expr) -> str | None:
    """`client` for `client.x` and `self.client.x`, likewise `recorder`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def writes(source: str) -> list[tuple[int, str, str]]:
    """(line, enclosing function as Class.method, the call) of each write call in `source`."""
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, where: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner, inner_function = where, in_function
            if isinstance(child, ast.ClassDef):
                inner, inner_function = f"{where}.{child.name}".lstrip("."), False
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and not in_function:
                # A function inside a function belongs to the outer one.
                inner, inner_function = f"{where}.{child.name}".lstrip("."), True
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                verb, receiver = child.func.attr, _receiver(child.func.value)
                if (receiver == "client" and verb in WRITE_VERBS) or (receiver == "recorder" and verb == "emit"):
                    found.append((child.lineno, where, f"{receiver}.{verb}"))
            visit(child, inner, inner_function)

    visit(ast.parse(source), "", False)
    return found


def test_only_the_appliers_write() -> None:
    outside = []
    allowed_seen = set()
    for path in sorted(CONTROLLER.glob("*.py")):
        if path.name in APPLIERS:
            continue
        for line, where, call in writes(path.read_text()):
            if (path.name, where) in OTHER_WRITERS:
                allowed_seen.add((path.name, where))
                continue
            outside.append(f"gate/controller/{path.name}:{line} ({where}) calls {call}")
    assert not outside, ("Writes outside the appliers (plan them, and let gate_applier or node_applier send "
                         "them; gate.controller.executor states the rule):\n" + "\n".join(outside))
    stale = set(OTHER_WRITERS) - allowed_seen
    assert not stale, f"listed as writers but write nothing any more: {sorted(stale)}"


def test_the_walk_names_module_line_and_function() -> None:
    source = (
        "class GateReconciler:\n"
        "    async def reconcile(self, key):\n"
        "        await self.client.get(NODEGATES, key)\n"
        "        async def inner():\n"
        "            await self.client.patch(NODEGATES, key, {})\n"
        "        await recorder.emit(obj, 'Normal', 'X', 'y')\n"
    )
    assert writes(source) == [(5, "GateReconciler.reconcile", "client.patch"),
                              (6, "GateReconciler.reconcile", "recorder.emit")]
