"""The package's modules import one another without a circle: every import, at module level or inside a function,
points one way. A circle hides which module a change must start from and breaks as soon as one of its members
imports a name at module level (the first one imported then sees a half-built module). Read with ``ast``, nothing is
imported."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "openrlhf_classmate"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The package module ``name`` names: itself, or the module holding the attribute it ends in."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (anywhere in its body; a package's ``__init__`` counts as itself)."""
    paths = {_module_name(path): path for path in sorted((ROOT / PACKAGE).rglob("*.py"))}
    modules = set(paths)
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                names = [f"{prefix}.{alias.name}" for alias in node.names] + [prefix]
            else:
                continue
            for name in names:
                target = _resolve(name, modules)
                # importing a sub-module runs its package's __init__ first: an edge, but not into oneself
                if target and target != module and not module.startswith(target + "."):
                    targets.add(target)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_in_the_package():
    found = cycles(import_graph())
    assert not found, "modules that import one another in a circle:\n" + "\n".join(" <-> ".join(c) for c in found)


STAGES = ("launch", "experience", "rollout", "classmate", "training")
"""``integration``'s packages, each importing only those after it (``integration/__init__.py`` says why this order)."""
INTEGRATION = f"{PACKAGE}.integration"


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == INTEGRATION.split(".") and parts[2] in STAGES else None


def test_the_stage_packages_import_downwards_and_never_the_controller():
    wrong = []
    for module, targets in import_graph().items():
        source = _stage(module)
        if source is None:
            continue
        for target in targets:
            stage = _stage(target)
            if target == f"{INTEGRATION}.trainer" or (stage and STAGES.index(stage) < STAGES.index(source)):
                wrong.append(f"{module} -> {target}")
    assert not wrong, f"imports against the order {' > '.join(STAGES)} (or into trainer.py):\n" + "\n".join(wrong)


def test_the_check_finds_a_circle_and_spares_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
