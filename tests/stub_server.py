"""A stub of an inference server's HTTP interface (vLLM-like; SGLang's self-stopping profiler as a
mode), for the capture tests and the README's quick start: it listens on 127.0.0.1 only and is
started and stopped by the test."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path


def serve(prof: Path, start: int = 200, mode: str = "write", port: int = 0) -> http.server.ThreadingHTTPServer:
    """Serve on 127.0.0.1:`port` (0: any free one) in a daemon thread; stop with .shutdown().
    /version, /v1/models, /tokenize; /start_profile answers `start` (404: a server started without
    --profiler-config); /stop_profile answers 200 and, with mode `write`, writes a worker's and the
    front end's trace into `prof` as vLLM names them, or with `die` drops the connection (the
    server went away); completions stream 3 tokens. `server.seen` holds the start body and prompts."""
    seen: dict = {}

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body, ctype="application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/server_info" and mode == "sglang-stopped":
                return self._send(200, json.dumps({"version": "0.5.23"}))
            if self.path == "/version":
                return self._send(200, json.dumps({"version": "0.32.0"}))
            if self.path == "/v1/models":
                return self._send(200, json.dumps({"data": [{"id": "tiny"}]}))
            return self._send(404, '{"detail": "Not Found"}')

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/start_profile":
                seen["start"] = json.loads(body or b"{}")
                if mode == "sglang-stopped":  # SGLang's profiler stops by itself and writes its traces
                    from tests.kineto_events import HOST, ev, write

                    for r in (0, 1):
                        write(prof / f"1796569413.65-TP-{r}.trace.json.gz",
                              [ev("step[EXTEND bs=1 toks=20]", 0, 900, HOST, "user_annotation"),
                               ev("aten::mm", 10, 800, HOST)], rank=r, world=2)
                return self._send(start, "{}")
            if self.path == "/stop_profile" and mode == "sglang-stopped":
                return self._send(500, json.dumps({"detail": "Profiling is not in progress. Call /start_profile first."}))
            if self.path == "/stop_profile":
                if mode == "die":
                    self.close_connection = True
                    return None
                if mode == "write":
                    from tests.kineto_events import HOST, ev, write

                    write(prof / "rank0.1796396678045716358.pt.trace.json.gz",
                          [ev("execute_context_1(20)_generation_0(0)", 0, 900, HOST, "user_annotation"),
                           ev("aten::mm", 10, 800, HOST)], rank=0, world=1)
                    write(prof / "vm_1.async_llm.1796396678014338521.pt.trace.json.gz",
                          [ev("AsyncLLM.generate", 0, 900, HOST, "user_annotation")], rank=0, world=1)
                return self._send(200, "{}")
            if self.path == "/tokenize":
                return self._send(200, json.dumps({"count": 20}))
            if self.path == "/v1/completions":
                seen.setdefault("prompts", []).append(json.loads(body)["prompt"])
                body = "".join(f'data: {json.dumps({"choices": [{"text": "x"}]})}\n\n' for _ in range(3))
                return self._send(200, body + "data: [DONE]\n\n", "text/event-stream")
            return self._send(404, "{}")


    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    server.seen = seen
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
