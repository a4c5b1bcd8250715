"""The package's layering, read from the sources' imports (every import statement, those inside
functions included, since a function-level import is how a cycle usually hides).

- no import cycle among the modules under isa/ (each module can be read, and tested, on top of
  the ones it imports);
- nothing under emulator/ imports the compiler (wse_emu.isa.compiler): the emulator runs
  programs, whoever made them; only the applications listed below do.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the folder that holds isa/, emulator/, kernels/
PACKAGE = "wse_emu"

# The applications (command line, demo, text generation, the bench suite and its reports):
# they compile models and then run them, and live under emulator/ until they get a package of
# their own above both the compiler and the emulator. No other module of emulator/ may import
# the compiler.
EMULATOR_APPLICATIONS = {"cli.py", "demo.py", "generate.py", "benchsuite.py", "benchreport.py"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that the file at `path` imports, anywhere in it."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            # `from pkg import mod` imports the module pkg.mod (pkg itself is its parent, loaded
            # first in any case); `from mod import name` imports mod
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            names = subs if len(subs) == len(node.names) else [base, *subs]
        else:
            continue
        for name in names:
            # `import a.b.c` runs a.b.c; the closest known module it names is the edge
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != me:
                found.add(name)
    return found


def import_graph(folder: str) -> dict[str, set[str]]:
    files = sorted((ROOT / folder).rglob("*.py"))
    known = {module_name(f) for f in files}
    return {module_name(f): imported_modules(f, known) for f in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_no_import_cycle_inside_isa():
    graph = import_graph("isa")
    assert len(graph) > 20 and "wse_emu.isa.compiler.pipeline" in graph  # the walk sees them
    assert "wse_emu.isa.program_checks" in graph["wse_emu.isa.builder"]  # edges are found
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle inside isa/: " + " -> ".join(cycle)


def test_find_cycle_finds_function_level_cycles(tmp_path):
    # the checker itself: a cycle closed by an import inside a function is still a cycle
    (tmp_path / "a.py").write_text("import wse_emu.b\n")
    (tmp_path / "b.py").write_text("def f():\n    from wse_emu.a import x\n")
    known = {"wse_emu.a", "wse_emu.b"}
    graph = {}
    for name in ("a", "b"):
        tree = ast.parse((tmp_path / f"{name}.py").read_text())
        graph[f"wse_emu.{name}"] = {
            n.module if isinstance(n, ast.ImportFrom) else n.names[0].name
            for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))} & known
    assert find_cycle(graph) == ["wse_emu.a", "wse_emu.b", "wse_emu.a"]
    assert find_cycle({"wse_emu.a": {"wse_emu.b"}, "wse_emu.b": set()}) is None


def test_emulator_does_not_import_the_compiler():
    compiler = {module_name(f) for f in (ROOT / "isa" / "compiler").rglob("*.py")}
    offenders = []
    for path in sorted((ROOT / "emulator").rglob("*.py")):
        if path.name in EMULATOR_APPLICATIONS:
            continue
        used = imported_modules(path, compiler | {f"{PACKAGE}.isa.compiler"})
        if used:
            offenders.append(f"{path.relative_to(ROOT)}: {', '.join(sorted(used))}")
    assert not offenders, "emulator modules importing the compiler:\n" + "\n".join(offenders)
    for name in EMULATOR_APPLICATIONS:  # the exceptions name real files (drop them when moved)
        assert (ROOT / "emulator" / name).is_file(), name
