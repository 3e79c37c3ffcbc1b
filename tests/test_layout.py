"""The shape of the package, checked: the worker's roles do not import each
other in a circle, no module grows past what reads in one sitting, and no
Lua script builds a key name (every key it touches comes in ``KEYS``, so
the scripts stay Redis-Cluster-safe and a proxy that checks declared keys
accepts them)."""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_cogworker"

#: The worker roles that must form no import cycle, even through TYPE_CHECKING.
ROLES = ("acks", "fetch", "fetch_mode", "manager", "processor", "settle", "ledger", "keeping")

#: The launcher and what it builds and starts: it imports them, and they
#: share one process context instead of reading it back through the launcher.
PROCESS_ROLES = (
    "launcher",
    "process",
    "manager",
    "heartbeat",
    "poller",
    "recovery",
    "supervisor",
    "supervisor_watch",
)

#: A module longer than this no longer reads in one sitting.
MAX_MODULE_LINES = 350


def imported_roles(module: str, roles: tuple[str, ...] = ROLES) -> set[str]:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):  # TYPE_CHECKING blocks included
        if isinstance(node, ast.ImportFrom) and node.module:
            name = node.module.removeprefix("django_cogworker.")
            if name in roles:
                found.add(name)
            if node.module == "django_cogworker":
                found |= {alias.name for alias in node.names if alias.name in roles}
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("django_cogworker.") for a in node.names} & set(roles)
    return found - {module}


def test_the_worker_roles_import_each_other_without_a_cycle():
    graph = {role: imported_roles(role) for role in ROLES}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(role: str) -> None:
        assert role not in visiting, f"import cycle: {' -> '.join([*visiting, role])}"
        if role in done:
            return
        visiting.append(role)
        for other in sorted(graph[role]):
            visit(other)
        visiting.pop()
        done.add(role)

    for role in ROLES:
        visit(role)
    assert "manager" not in set().union(*graph.values()), "only the launcher imports the manager"


def test_no_role_the_launcher_starts_imports_the_launcher_back():
    graph = {role: imported_roles(role, PROCESS_ROLES) for role in PROCESS_ROLES}
    assert sorted(role for role, imports in graph.items() if "launcher" in imports) == []
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_only_the_launcher_imports_the_manager():
    importers = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if re.search(
            r"^\s*(from django_cogworker\.manager import|from django_cogworker import manager)",
            path.read_text(),
            re.M,
        )
    ]
    assert importers == ["launcher.py"]


def test_no_module_is_longer_than_one_sitting():
    long = {
        path.relative_to(PACKAGE).as_posix(): n
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


CALL = re.compile(r"redis\.p?call\(\s*\"(\w+)\"\s*(?:,\s*([^,)]+))?")
KEYLESS = {"TIME", "INFO", "PING"}


def test_every_key_a_script_touches_comes_in_keys():
    offenders = []
    for path in sorted((PACKAGE / "lua").rglob("*.lua")):
        lines = [line.split("--", 1)[0] for line in path.read_text().splitlines()]
        names = set()  # the names used as keys: locals and parameters
        for number, code in enumerate(lines, 1):
            for command, key in CALL.findall(code):
                key = key.strip()
                if command in KEYLESS:
                    continue
                if re.fullmatch(r"[a-z_]+", key):
                    names.add(key)
                elif not re.fullmatch(r"KEYS\[[^\]]+\]", key):
                    offenders.append(f"{path.name}:{number}: {code.strip()}")
        for number, code in enumerate(lines, 1):
            # A name used as a key must not be made up by concatenation.
            assigned = re.match(r"\s*(?:local\s+)?([a-z_]+)\s*=[^=].*\.\.", code)
            if assigned and assigned[1] in names:
                offenders.append(f"{path.name}:{number}: builds a key: {code.strip()}")
    assert offenders == []


def module_imports(package: Path) -> dict[str, set[str]]:
    """Every module of ``package`` (dotted, without the package's name) ->
    the modules of the package it imports, anywhere in its text."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    prefix = f"{package.name}."
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            found = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = node.module.removeprefix(prefix) if node.module != package.name else ""
                subs = [f"{base}.{a.name}".lstrip(".") for a in node.names]
                found += subs
                # ``from package.x import name``: x itself, unless each name is a module of x.
                if any(sub not in modules for sub in subs):
                    found.append(base)
            elif isinstance(node, ast.Import):
                found += [a.name.removeprefix(prefix) for a in node.names]
            graph[name] |= {other for other in found if other in modules and other != name}
    return graph


def cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """An import path from ``start`` back to itself, or None."""
    seen: set[str] = set()
    stack = [(start, [start])]
    while stack:
        name, path = stack.pop()
        for other in sorted(graph[name]):
            if other == start:
                return [*path, start]
            if other not in seen:
                seen.add(other)
                stack.append((other, [*path, other]))
    return None


def test_no_module_of_the_package_is_in_an_import_cycle():
    """Counting every import (in TYPE_CHECKING blocks and inside functions
    too): a lazy import that hides a circle is still a circle."""
    graph = module_imports(PACKAGE)
    cycles = {name: cycle_through(graph, name) for name in graph}
    assert {name: " -> ".join(cycle) for name, cycle in cycles.items() if cycle} == {}


def test_errors_is_a_leaf_translating_and_not_reacting():
    assert module_imports(PACKAGE)["errors"] == set()
