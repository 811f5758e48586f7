"""Traces named by fsspec URLs (issue: scale): a run read through file://, a zip archive or
memory:// gives the analysis of the same files read from disk, in one process and in a pool; a
URL that cannot be read is one line, exit 2."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import zipfile

import pytest

from commprobe.analyzers.analysis import analyze
from tests.conftest import run_cli

fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed (pip install 'commprobe[cluster]')")

DLRM = "facebookresearch-param"


def _same(local: dict, remote: dict) -> None:
    """Equal in everything but where the files were (the paths) and the time it took."""
    a, b = json.loads(json.dumps(local)), json.loads(json.dumps(remote))
    for doc in (a, b):
        doc.pop("elapsed_s")
        doc.pop("source")
        for rk in doc["ranks"]:
            rk.pop("file")
    assert a == b


def test_a_run_directory_by_file_url_and_inside_a_zip(real_traces, tmp_path):
    d = real_traces / DLRM
    local = analyze(d)
    by_url = analyze(f"file://{d}")
    _same(local, by_url)
    assert by_url["source"]["files"] == sorted(f"file://{f}" for f in local["source"]["files"])
    assert by_url["collectives"]["straggler"] == local["collectives"]["straggler"] == 7
    archive = tmp_path / "set.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in sorted(d.glob("*.json.gz")):
            z.write(f, f"run/{f.name}")
    zipped = analyze(f"zip://run::file://{archive}", jobs=2)  # the pool's workers open the URLs themselves
    _same(local, zipped)
    assert len(zipped["source"]["files"]) == 8 and all(f.endswith(f"::file://{archive}") for f in zipped["source"]["files"])


def test_one_trace_in_memory_and_an_export_by_url(real_traces):
    f = real_traces / "hta" / "nccl_parser_config_nccl_data.json.gz"
    if not f.exists():
        pytest.skip(f"{f} not found")
    mem = fsspec.filesystem("memory")
    mem.pipe("/commprobe-test/rank-0.json", gzip.decompress(f.read_bytes()))  # plain JSON this time
    try:
        _same(analyze(f), analyze("memory:///commprobe-test/rank-0.json"))
    finally:
        mem.rm("/commprobe-test", recursive=True)
    export = real_traces / "hpcgroup-pipit" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
    local, by_url = analyze(export), analyze(f"file://{export}")  # copied to a temporary file: SQLite reads local files
    _same(local, by_url)
    assert by_url["source"]["files"] == [f"file://{export}"] * len(local["ranks"])


@pytest.mark.parametrize("url, says", [
    ("nosuch://bucket/run/", "Protocol not known: nosuch"),
    ("file:///nonexistent/run/", "no such file or directory"),
    ("memory:///commprobe-nothing/rank0.json", "no such file or directory"),
])
def test_an_unreadable_url_is_one_line(url, says):
    r = run_cli("analyze", url)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and url in lines[0] and says in lines[0], r.stderr


def test_a_cloud_url_without_its_package_names_it(tmp_path):
    try:
        import s3fs  # noqa: F401
        pytest.skip("s3fs is installed here: an s3:// URL would try the network")
    except ImportError:
        pass
    r = run_cli("analyze", "s3://commprobe-no-bucket/run/", "--jobs", "1")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "s3fs" in lines[0], r.stderr


def test_a_truncated_trace_by_url_is_named(real_traces, tmp_path):
    src = real_traces / DLRM
    run = tmp_path / "run"
    shutil.copytree(src, run, ignore=shutil.ignore_patterns("README*"))
    os.chmod(run, 0o755)  # the shared set is read-only; so is its copy
    victim = sorted(run.glob("*.json.gz"))[3]
    os.chmod(victim, 0o644)
    victim.write_bytes(victim.read_bytes()[:5000])
    r = run_cli("analyze", f"file://{run}", "--jobs", "2")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and f"file://{victim}" in lines[0] and "gzip" in lines[0], r.stderr


def test_listed_names_become_urls_of_the_same_filesystem():
    from commprobe.analyzers.readers.remote import _child

    assert _child("zip://run::s3://b/set.zip", None, "run/rank0.json") == "zip://run/rank0.json::s3://b/set.zip"
    assert _child("s3://b/run/", None, "b/run/rank0.json") == "s3://b/run/rank0.json"
    assert _child("https://h/run/", None, "https://h/run/rank0.json") == "https://h/run/rank0.json"  # http lists URLs
