"""Imports go one way (README, "What is here"): common <- collectives <- reference_impl <- probe,
and common <- analyzers <- gate, reports; plan reads model shapes and bundles, never the
analyzers. Checked on the source with `ast`, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "collectives", "reference_impl", "analyzers", "gate", "plan", "reports", "probe")
ALLOWED = {
    "common": set(),
    "collectives": {"common"},
    "reference_impl": {"collectives", "common"},
    "analyzers": {"common"},
    "gate": {"analyzers", "common"},
    "plan": {"common", "reference_impl", "analyzers"},  # a prediction from a trace reads its analysis (issue 58)
    "reports": {"common"},
    "probe": set(PACKAGES),
}
TORCH_FREE = ("common", "analyzers", "gate", "plan", "reports")


def imports_of(path: Path) -> set[str]:
    """Top-level modules a file imports, with commprobe.X reported as X."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for n in names:
            parts = n.split(".")
            out.add(parts[1] if parts[0] == "commprobe" and len(parts) > 1 else parts[0])
    return out


def test_imports_follow_the_data_flow():
    bad = []
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for dep in imports_of(f) & set(PACKAGES) - {pkg} - ALLOWED[pkg]:
                bad.append(f"{f.relative_to(ROOT)} imports {dep}")
    assert not bad, bad


def test_torch_free_packages_never_name_torch():
    bad = [f"{f.relative_to(ROOT)}" for pkg in TORCH_FREE for f in sorted((ROOT / pkg).rglob("*.py"))
           if "torch" in imports_of(f)]
    assert not bad, bad


def test_packages_import_their_own_names_through_commprobe():
    """Installed, the folders are commprobe.X (pyproject); a bare `import analyzers` would only
    work from a checkout."""
    bad = [f"{f.relative_to(ROOT)}" for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))
           if any(isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] in PACKAGES
                  for n in ast.walk(ast.parse(f.read_text())))]
    assert not bad, bad


def _module_name(f: Path, root: Path = ROOT) -> str:
    rel = f.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(f: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """The project's modules a file imports, lazy ones included: absolute commprobe.X.Y and
    relative imports resolved to module names (`from . import a` names a module when one exists)."""
    me = _module_name(f, root)
    pkg = me if f.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(f.read_text(), str(f))):
        if isinstance(node, ast.Import):
            bases = [a.name.removeprefix("commprobe.") for a in node.names if a.name.startswith("commprobe.")]
            names: list[str] = []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                bases = [".".join(base + ([node.module] if node.module else []))]
            elif (node.module or "").startswith("commprobe."):
                bases = [node.module.removeprefix("commprobe.")]
            else:
                continue
            names = [a.name for a in node.names]
        else:
            continue
        for b in bases:
            subs = [f"{b}.{n}" for n in names if f"{b}.{n}" in known]
            out.update(subs or ([b] if b in known else []))
    out.discard(me)
    return out


def _graph() -> dict[str, set[str]]:
    files = [f for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))]
    known = {_module_name(f) for f in files}
    return {_module_name(f): _module_imports(f, known) for f in files}


def test_no_import_circle_in_any_package():
    """Tarjan's strongly connected components over the module graph (lazy imports count: a circle
    hidden in a function body is still two modules that need each other)."""
    graph = _graph()
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_the_circle_finder_sees_a_lazy_circle(tmp_path):
    """The finder itself: two modules that import each other, one of them lazily, are one circle."""
    pkg = tmp_path / "analyzers"
    pkg.mkdir()
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n")
    known = {"analyzers.a", "analyzers.b"}
    rel = {n: _module_imports(pkg / f"{n.split('.')[1]}.py", known, tmp_path) for n in known}
    assert rel == {"analyzers.a": {"analyzers.b"}, "analyzers.b": {"analyzers.a"}}


ANALYZER_LAYERS = ("readers", "per_rank", "cross_rank")


def test_analyzer_layers_import_downwards_only():
    """readers <- per_rank <- cross_rank <- analysis: a reader never asks the pipeline, the
    pipeline never the cross-rank step."""
    bad = []
    for mod, deps in _graph().items():
        parts = mod.split(".")
        if parts[0] != "analyzers" or len(parts) < 3 or parts[1] not in ANALYZER_LAYERS:
            continue
        mine = ANALYZER_LAYERS.index(parts[1])
        for d in deps:
            dp = d.split(".")
            if dp[0] == "analyzers" and len(dp) > 1 and dp[1] in ANALYZER_LAYERS and ANALYZER_LAYERS.index(dp[1]) > mine:
                bad.append(f"{mod} imports {d}")
            if dp[0] == "analyzers" and len(dp) == 2 and dp[1] == "analysis":
                bad.append(f"{mod} imports the facade {d}")
    assert not bad, bad


def test_vocabulary_imports_nothing_of_ours():
    f = ROOT / "common" / "vocab.py"
    assert imports_of(f) <= {"__future__", "enum"}, imports_of(f)


MAX_LINES = 450


def test_no_source_module_is_over_450_lines():
    long = [f"{f.relative_to(ROOT)}: {n}" for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))
            if (n := len(f.read_text().splitlines())) > MAX_LINES]
    assert not long, long
