"""hopmm's modules import one another one way (api -> tuning -> operands -> launch ...): no
module reaches back up, not even from inside a function."""
import ast
from pathlib import Path

import hopmm

PACKAGE = Path(hopmm.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    """Names of the hopmm modules `path` imports, at module level or inside functions."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:   # from .x import y
                names.add(node.module.split(".")[0])
            else:             # from . import x, y
                names.update(alias.name for alias in node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for full in [module] if module else [a.name for a in node.names]:
                if full.startswith("hopmm."):
                    names.add(full.split(".")[1])
    return names


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    return {m: _imported_modules(PACKAGE / f"{m}.py") & modules for m in modules}


def test_the_import_graph_finds_known_edges():
    graph = _graph()
    assert "tuning" in graph["api"] and "launch" in graph["operands"]


def test_modules_import_each_other_without_a_cycle():
    graph = _graph()
    done, on_path = set(), []

    def visit(m):
        if m in on_path:
            raise AssertionError("import cycle: " + " -> ".join(on_path[on_path.index(m):] + [m]))
        if m in done:
            return
        on_path.append(m)
        for dep in sorted(graph[m]):
            visit(dep)
        on_path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
