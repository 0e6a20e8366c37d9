"""The import graph has no cycles, function-local imports included.

import-linter (run by the gate) enforces the layers between rooms; this test covers
what layers cannot: a cycle inside one room, or between two modules of one layer
joined by ":". grimp counts imports inside functions too, so a cycle dodged with a
function-local import is still a cycle here.
"""

from __future__ import annotations

import grimp
import pytest

PACKAGES = ("placement", "models", "policies")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles(graph: grimp.ImportGraph) -> None:
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    """The check itself: a graph with a planted cycle is reported."""
    planted = grimp.ImportGraph()
    for module in ("x", "x.a", "x.b", "x.c"):
        planted.add_module(module)
    planted.add_import(importer="x.a", imported="x.b")
    planted.add_import(importer="x.b", imported="x.c")
    planted.add_import(importer="x.c", imported="x.a")
    assert _cycles(planted) == [["x.a", "x.b", "x.c"]]
