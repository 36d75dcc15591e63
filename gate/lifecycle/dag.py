"""The dependency graph of a gate's packages: order, readiness and cycles."""

from __future__ import annotations

from collections.abc import Mapping, Set


def find_cycle(depends_on: Mapping[str, Set[str]]) -> list[str] | None:
    """A dependency cycle as a path that returns to its start (["a", "b", "a"]), or None.

    Only edges between known packages count; a dependency on a missing package is a different error.
    Deterministic: nodes and edges are visited in sorted order.
    """
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(depends_on, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = grey
        stack.append(node)
        for dep in sorted(depends_on.get(node, ())):
            if dep not in colour:
                continue
            if colour[dep] == grey:
                return [*stack[stack.index(dep):], dep]
            if colour[dep] == white and (found := visit(dep)):
                return found
        stack.pop()
        colour[node] = black
        return None

    for start in sorted(depends_on):
        if colour[start] == white and (cycle := visit(start)):
            return cycle
    return None


def topological_order(depends_on: Mapping[str, Set[str]]) -> list[str]:
    """Packages so that each comes after its dependencies; ties broken by name. Raises on a cycle."""
    cycle = find_cycle(depends_on)
    if cycle:
        raise ValueError("dependency cycle: " + " -> ".join(cycle))
    order: list[str] = []
    done: set[str] = set()
    remaining = set(depends_on)
    while remaining:
        ready = sorted(p for p in remaining if all(d in done or d not in depends_on for d in depends_on[p]))
        order.extend(ready)
        done.update(ready)
        remaining.difference_update(ready)
    return order
