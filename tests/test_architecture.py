"""The shape of the code: import arrows, no import circles, pure cores without Django.

The apps are layered `web → scheduler → notify → market → billing → pool → fabric → ibex`:
a module may import its own app and the apps to its right, never to its left, and this
holds for imports inside functions too. Pure cores (every `core/` package, and the what-if
commands built on them) import nothing of Django, Celery or DRF, so the simulator, the
benchmarks and the workers share one engine.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["web", "scheduler", "notify", "market", "billing", "pool", "fabric", "ibex"]
PURE_COMMANDS = ["scheduler/placement", "scheduler/clearing", "scheduler/simulate"]
FRAMEWORKS = {"django", "rest_framework", "drf_spectacular", "django_filters", "celery"}


def project_modules() -> dict[str, Path]:
    modules = {}
    for app in LAYERS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = project_modules()


def imported_names(module: str, path: Path) -> list[tuple[str, int]]:
    """Every name an import statement anywhere in the module brings in, with its line."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.append((base, node.lineno))
            names += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return names


def project_module_of(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, dict[str, int]]:
    graph = {}
    for module, path in MODULES.items():
        targets = {}
        for name, line in imported_names(module, path):
            target = project_module_of(name)
            if target and target != module:
                targets.setdefault(target, line)
        graph[module] = targets
    return graph


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_every_import_points_down_the_layers():
    upward = [
        f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}"
        for module, targets in import_graph().items()
        for target, line in targets.items()
        if layer(target) < layer(module)
    ]

    assert upward == []


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_two_modules_import_each_other_even_through_others():
    assert strongly_connected(import_graph()) == []


def pure_modules() -> list[str]:
    return [
        module for module, path in MODULES.items()
        if "core" in path.relative_to(ROOT).parts[:-1]
        or any(str(path.relative_to(ROOT)).startswith(command + "/") for command in PURE_COMMANDS)
    ]


def test_the_pure_cores_import_no_framework():
    found = [
        f"{MODULES[module].relative_to(ROOT)}:{line} imports {name}"
        for module in pure_modules()
        for name, line in imported_names(module, MODULES[module])
        if name.split(".")[0] in FRAMEWORKS
        or ((target := project_module_of(name)) and target not in pure_modules())
    ]

    assert pure_modules(), "the pure cores moved: update this test's idea of where they are"
    assert found == []


# --- the client package -------------------------------------------------------------------------
# `ibex_client` (the `ibex` command and the Python client) stands aside like `agent/`: it is
# installed on people's laptops, so it imports no app, no framework, nothing of the server:
# the standard library, `requests` and itself only.
CLIENT = "ibex_client"
CLIENT_MAY_IMPORT = {CLIENT, "requests", "__future__"}


def client_modules() -> dict[str, Path]:
    modules = {}
    for path in (ROOT / CLIENT).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def test_the_client_imports_only_itself_requests_and_the_standard_library():
    import sys

    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for module, path in client_modules().items()
        for name, line in imported_names(module, path)
        if (top := name.split(".")[0]) not in CLIENT_MAY_IMPORT
        and top not in sys.stdlib_module_names
    ]

    assert client_modules(), "the client moved: update this test's idea of where it is"
    assert found == []


def test_no_app_imports_the_client():
    found = [
        f"{MODULES[module].relative_to(ROOT)}:{line} imports {name}"
        for module, path in MODULES.items()
        for name, line in imported_names(module, path)
        if name.split(".")[0] == CLIENT
    ]

    assert found == []
