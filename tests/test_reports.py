"""HTML report: self-contained, charts present, every trace string escaped."""

import gzip
import json

from analyzers.analysis import analyze
from reports.html import render_html
from tests.conftest import run_cli

EVIL = "<script>alert(1)</script>"


def _trace(path, rank):
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
          {"ph": "X", "cat": "kernel", "name": EVIL, "ts": 0, "dur": 400, "pid": 0, "tid": 7},
          {"ph": "X", "cat": "weird", "name": "</script><b>x</b>", "ts": 10, "dur": 5, "pid": 1, "tid": 1},
          {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 300 + 50 * rank,
           "dur": 300 - 50 * rank, "pid": 0, "tid": 20,
           "args": {"Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float", "Group size": 2,
                    "Process Group Name": "0"}}]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev, "distributedInfo": {"rank": rank, "world_size": 2},
                   "baseTimeNanoseconds": 1_700_000_000_000_000_000}, f)


def test_report_escapes_trace_strings_and_embeds_plotly(tmp_path):
    for r in (0, 1):
        _trace(tmp_path / f"rank{r}.json.gz", r)
    result = analyze(tmp_path)
    assert any(u["name"] == "</script><b>x</b>" for u in result["unclassified"]["names"])
    result["manifest"] = {"host": EVIL, "model": {"name": EVIL}}  # manifest strings are escaped too
    page = render_html(result)
    assert EVIL not in page and "</script><b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;" in page  # shown as text in the unclassified table
    assert page.count("Plotly.newPlot(") == 2 and "plotly.js" in page.lower()
    assert "http://" not in page.split("<script>")[0] and 'src="http' not in page  # nothing fetched: offline


def test_report_cli_writes_the_file(tmp_path):
    _trace(tmp_path / "rank0.json.gz", 0)
    out = tmp_path / "r.html"
    r = run_cli("report", str(tmp_path / "rank0.json.gz"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1_000_000  # plotly.js is inside
    r = run_cli("report", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_report_draws_in_headless_chromium(tmp_path):
    """The charts really draw (plotly's SVG is in the live DOM) and no script error is logged."""
    import shutil
    import subprocess

    import pytest

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        pytest.skip("Chromium not installed (Debian package 'chromium'); the report is checked without a browser")
    for r in (0, 1):
        _trace(tmp_path / f"rank{r}.json.gz", r)
    page = tmp_path / "report.html"
    page.write_text(render_html(analyze(tmp_path)), encoding="utf-8")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
             "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
    r = subprocess.run([browser, *flags], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1000:]
    dom = r.stdout
    assert dom.count('class="main-svg"') >= 2 * 2  # plotly draws two SVG layers per chart
    assert "Uncaught" not in r.stderr and "alert(1)" not in dom.replace("&lt;script&gt;alert(1)&lt;/script&gt;", "")
