"""The package's layering, read from the sources' imports (every import statement, those inside
functions included, since a function-level import is how a cycle usually hides, and how a
layer most easily reaches one above it).

- no import cycle among the modules under isa/ (each module can be read, and tested, on top of
  the ones it imports);
- the emulator (every module under emulator/ but emulator/apps/) imports neither the compiler
  (wse_emu.isa.compiler) nor the applications (wse_emu.apps): it runs programs, whoever made
  them. The applications (CLI, demo, bench suite and reports) compile models and then run them,
  so they sit above both, in emulator/apps/ installed as wse_emu.apps (pyproject.toml);
- the kernels import neither the emulator nor the applications;
- isa/ imports neither the emulator nor the applications nor Numba.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the folder that holds isa/, emulator/, kernels/
PACKAGE = "wse_emu"
APPS = ROOT / "emulator" / "apps"  # installed as wse_emu.apps, not wse_emu.emulator.apps


def module_name(path: Path) -> str:
    if path.is_relative_to(APPS):
        parts = ["apps", *path.relative_to(APPS).with_suffix("").parts]
    else:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def emulator_files() -> list[Path]:
    """The emulator's own modules: every .py under emulator/ outside the applications."""
    return [p for p in sorted((ROOT / "emulator").rglob("*.py")) if not p.is_relative_to(APPS)]


def _imports(path: Path):
    """(package of the module at `path`, its name, and every import statement in it as
    (absolute base module, names taken from it)): `import a.b` gives (a.b, []), `from a
    import b` (a, [b]), relative imports made absolute."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            found.append((base, [a.name for a in node.names]))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__"):
                found.append((node.args[0].value, []))
    return me, found


def imported_names(path: Path) -> set[str]:
    """Every module name the file at `path` names in an import, anywhere in it, made absolute:
    `import a.b` gives a.b, `from a import b` gives a and a.b (b may be a module), and
    `importlib.import_module("a.b")` or `__import__("a.b")` with a literal name gives a.b."""
    names = set()
    for base, taken in _imports(path)[1]:
        names.add(base)
        names.update(f"{base}.{t}" for t in taken)
    return names


def offenders(files: list[Path], banned: tuple[str, ...]) -> list[str]:
    """`file: module` for every import in `files` of a module in (or under) one of `banned`."""
    out = []
    for path in files:
        hits = sorted(n for n in imported_names(path)
                      if any(n == b or n.startswith(b + ".") for b in banned))
        if hits:
            out.append(f"{path.relative_to(ROOT)}: {', '.join(hits)}")
    return out


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that the file at `path` imports, anywhere in it."""
    me, imports = _imports(path)
    found = set()
    for base, taken in imports:
        # `from pkg import mod` imports the module pkg.mod (pkg itself is its parent, loaded
        # first in any case); `from mod import name` imports mod
        subs = [f"{base}.{t}" for t in taken if f"{base}.{t}" in known]
        names = subs if taken and len(subs) == len(taken) else [base, *subs]
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


def test_emulator_imports_neither_the_compiler_nor_the_applications():
    files = emulator_files()
    names = {p.name for p in files}
    assert {"core.py", "load.py", "generate.py", "api.py"} <= names  # the walk sees them
    assert not names & {"cli.py", "demo.py", "benchsuite.py", "benchreport.py"}
    bad = offenders(files, (f"{PACKAGE}.isa.compiler", f"{PACKAGE}.apps"))
    assert not bad, "emulator modules importing the compiler or the applications:\n" + \
        "\n".join(bad)


def test_the_applications_are_their_own_package():
    apps = sorted(APPS.glob("*.py"))
    assert {"cli.py", "demo.py", "benchsuite.py", "benchreport.py"} <= {p.name for p in apps}
    assert module_name(APPS / "cli.py") == f"{PACKAGE}.apps.cli"
    assert not (APPS / "__init__.py").exists()  # a namespace portion, as the other folders
    # the checker sees a function-level import of the compiler (the applications have them)
    assert offenders([APPS / "cli.py"], (f"{PACKAGE}.isa.compiler",))


def test_kernels_import_neither_the_emulator_nor_the_applications():
    files = sorted((ROOT / "kernels").rglob("*.py"))
    assert len(files) > 5
    bad = offenders(files, (f"{PACKAGE}.emulator", f"{PACKAGE}.apps"))
    assert not bad, "kernels importing the emulator or the applications:\n" + "\n".join(bad)


def test_isa_imports_neither_the_emulator_nor_the_applications_nor_numba():
    files = sorted((ROOT / "isa").rglob("*.py"))
    assert len(files) > 20
    bad = offenders(files, (f"{PACKAGE}.emulator", f"{PACKAGE}.apps", "numba", "llvmlite"))
    assert not bad, "isa/ importing the emulator, the applications or Numba:\n" + "\n".join(bad)


def test_the_checker_sees_imports_inside_functions(tmp_path, monkeypatch):
    # a lazy import (inside a function, relative or absolute) is an import all the same
    folder = tmp_path / "emulator"
    folder.mkdir()
    (folder / "lazy.py").write_text("def f():\n    from wse_emu.isa.compiler.predict import Cost\n")
    (folder / "rel.py").write_text("def g():\n    from ..apps import cli\n")
    (folder / "dynamic.py").write_text(
        "import importlib\ndef h():\n    return importlib.import_module('wse_emu.apps.demo')\n")
    (folder / "fine.py").write_text("from wse_emu.isa.program import Program\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)  # module_name reads paths against ROOT
    bad = offenders(sorted(folder.glob("*.py")), (f"{PACKAGE}.isa.compiler", f"{PACKAGE}.apps"))
    assert [b.split(":")[0] for b in bad] == ["emulator/dynamic.py", "emulator/lazy.py",
                                              "emulator/rel.py"]
