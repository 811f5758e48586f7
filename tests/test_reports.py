"""HTML report: self-contained, charts present, every trace string escaped."""

import json

import pytest

from commprobe.analyzers.analysis import analyze
from commprobe.reports.html import render_html
from tests.conftest import run_cli
from tests.kineto_events import HOST, SIDE, ev, kernel, write

EVIL = "<script>alert(1)</script>"


def _trace(path, rank):
    write(path, [ev("ProfilerStep#1", 0, 1000, HOST, "user_annotation", pid=1),
                 kernel(EVIL, 0, 400),
                 ev("</script><b>x</b>", 10, 5, HOST, "weird", pid=1),
                 kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300 + 50 * rank, 300 - 50 * rank, SIDE, **{
                     "Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float", "Group size": 2,
                     "Process Group Name": "0"})], rank=rank, world=2)


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
    assert page.count("Plotly.newPlot(") == 3 and "plotly.js" in page.lower()  # breakdown, step timeline, sizes
    assert 'id="fig-timeline-step"' in page
    assert "http://" not in page.split("<script>")[0] and 'src="http' not in page  # nothing fetched: offline


def test_report_cli_writes_the_file(tmp_path):
    _trace(tmp_path / "rank0.json.gz", 0)
    out = tmp_path / "r.html"
    r = run_cli("report", str(tmp_path / "rank0.json.gz"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1_000_000  # plotly.js is inside
    r = run_cli("report", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "no such file" in r.stderr


@pytest.fixture(scope="module")
def ab_bundle(tmp_path_factory):
    """A real run with two backends (gloo, dda), telemetry included."""
    out = tmp_path_factory.mktemp("rep") / "ab"
    r = run_cli("profile", "--preset", "tiny", "--steps", "4", "--repeats", "2", "--prompt-len", "16",
                "--backend", "gloo,dda", "--out", str(out), "--telemetry-interval", "0.02")
    assert r.returncode == 0, r.stderr
    return out


def test_report_of_a_two_backend_run_has_every_chart(ab_bundle, tmp_path):
    """Breakdown, the per-rank timelines of the prefill and of a decode step, latency/busbw per
    backend, and the telemetry aligned to the phases; `--json` prints the analysis."""
    out = tmp_path / "ab.html"
    r = run_cli("report", str(ab_bundle), "-o", str(out))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    for fig in ("breakdown", "timeline-prefill", "timeline-decode", "backends", "telemetry"):
        assert f'id="fig-{fig}"' in page, fig
    assert "gloo allreduce latency" in page and "dda allreduce busbw" in page
    r = run_cli("report", str(ab_bundle / "dda"), "-o", str(tmp_path / "d.html"), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    seg = res["ranks"][1]["segments"]["decode"]
    assert seg["window"] == 2 and seg["by_category"]["tp_allreduce"]  # decode[2] of 4, allreduces in it
    assert all(0 <= a <= b <= seg["dur_us"] + 1e-6 for a, b in seg["by_category"]["compute"])
    tel = res["telemetry"]
    cpu = tel["series"]["host CPU utilization (mean of cores)"]
    prefill = res["ranks"][0]["windows"]["prefill"][0]
    assert tel["samples"] > 5 and cpu["t_us"][0] < prefill[0]  # sampling began before the recorded prefill


def test_report_draws_in_headless_chromium(tmp_path, ab_bundle):
    """The charts really draw (plotly's SVG is in the live DOM) and no script error is logged."""
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        pytest.skip("Chromium not installed (Debian package 'chromium'); the report is checked without a browser")
    for r in (0, 1):
        _trace(tmp_path / f"rank{r}.json.gz", r)
    page = tmp_path / "report.html"
    page.write_text(render_html(analyze(tmp_path)), encoding="utf-8")
    _chromium_draws(browser, page, tmp_path, charts=3)
    real = tmp_path / "real.html"
    r = run_cli("report", str(ab_bundle), "-o", str(real))
    assert r.returncode == 0, r.stderr
    _chromium_draws(browser, real, tmp_path, charts=5)


def _chromium_draws(browser, page, tmp_path, charts):
    import subprocess

    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
             "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
    r = subprocess.run([browser, *flags], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1000:]
    dom = r.stdout
    assert dom.count('class="main-svg"') >= 2 * charts  # plotly draws two SVG layers per chart
    assert "Uncaught" not in r.stderr and "alert(1)" not in dom.replace("&lt;script&gt;alert(1)&lt;/script&gt;", "")
