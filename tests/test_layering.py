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
    "plan": {"common", "reference_impl"},
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
