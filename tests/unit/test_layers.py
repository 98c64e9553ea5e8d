"""The import graph of the package has no circle (docs/architecture.md, "Layers").

`lint-imports` (run by `make lint`) checks that the layers point down; this test checks what
a layers contract cannot see: a circle inside one layer or one sub-package.  Every import
counts, inside functions and under ``TYPE_CHECKING`` too, but the one named exception
(``errors`` -> ``results``, type-only).
"""

from __future__ import annotations

import grimp

#: The one import that may point back: an error carries its result (type-only).
EXCEPTION = ("agentnest.errors", "agentnest.results")


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def targets(module: str) -> list[str]:
        return sorted(t for t in graph.find_modules_directly_imported_by(module) if (module, t) != EXCEPTION)

    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(targets(root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(targets(child))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def test_the_package_has_no_import_circle() -> None:
    graph = grimp.build_graph("agentnest", exclude_type_checking_imports=False, cache_dir=None)
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert circles(graph) == [["p.a", "p.b"]]
