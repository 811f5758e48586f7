"""The README's quick start runs as written (issue 62): every command of its `bash` blocks, in a
fresh clone of this repository, with the commprobe this environment installed. The install block
is run as written by `.ci/run` on its fresh clone (checked here); the capture's server is
tests/stub_server.py on the address the README gives, and the trace directory it names."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.stub_server import serve


def _section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"README has no '## {title}' section"
    return m.group(1)


def _commands(title: str) -> list[str]:
    blocks = re.findall(r"^```bash\n(.*?)^```", _section(title), re.S | re.M)
    return [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_the_install_block_is_what_ci_runs():
    (line,) = _commands("Install")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "awk" in ci and "## Install" in ci and 'eval "$install"' in ci, "CI must run the README's install block"
    assert line.startswith("pip install torch==2.13.0 -e ")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_quick_start_runs_as_written(tmp_path):
    commands = _commands("Quick start")
    assert any(c.startswith("commprobe profile") for c in commands) and any(c.startswith("commprobe capture")
                                                                           for c in commands)
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the quick start is run in a fresh clone of it")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    server, made = None, None
    try:
        for cmd in commands:
            argv = shlex.split(cmd)
            if argv[:2] == ["commprobe", "capture"]:
                port = int(re.search(r"127\.0\.0\.1:(\d+)", cmd).group(1))
                trace_dir = Path(argv[argv.index("--trace-dir") + 1])
                if not _port_free(port) or trace_dir.exists():
                    pytest.skip(f"port {port} or {trace_dir} in use here: the capture line cannot run as written")
                trace_dir.mkdir(parents=True)
                made = trace_dir
                server = serve(trace_dir, 200, "write", port)
            r = subprocess.run(argv, cwd=clone, capture_output=True, text=True, timeout=300, env=env)
            assert r.returncode == 0, f"{cmd}\n{r.stderr[-2000:]}"
            assert "verdict" in r.stdout or "report:" in r.stdout or " is " in r.stdout, (cmd, r.stdout[-1000:])
        assert (clone / "runs" / "first" / "manifest.json").is_file() and (clone / "report.html").is_file()
        assert (clone / "runs" / "served" / "manifest.json").is_file()
    finally:
        if server:
            server.shutdown()
        if made:
            shutil.rmtree(made, ignore_errors=True)


def test_the_troubleshooting_pages_messages_are_the_codes():
    """Each message part the troubleshooting page quotes (a table's first column, in backticks;
    parts joined by '…') is still written by the code, so the page cannot list errors that no
    longer exist."""
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    source = "\n".join(p.read_text() for d in ("analyzers", "probe", "common", "collectives", "gate", "plan", "reports")
                       for p in (ROOT / d).rglob("*.py")) + (ROOT / "collectives" / "dda_cpu.c").read_text()
    quoted = [q for row in page.splitlines() if row.startswith("| `")
              for q in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert len(quoted) >= 20
    missing = [q for q in quoted if not all(part.strip() in source for part in q.split("…") if part.strip())]
    assert not missing, missing
