"""A client for torch's per-rank worker server (`torch._C._distributed_c10d._WorkerServer`):
HTTP/1.1 over a unix socket, or over 127.0.0.1 only. Handlers are POSTed to `/handler/NAME`
(torch.distributed.debug's frontend does the same): `fr_trace_json` (the rank's Flight Recorder
records as JSON: entries, pg_config, pg_status), `dump_traceback` (every thread's Python stack,
faulthandler's text), `ping`.

What comes back is input, read as carefully as a file: at most MAX_BYTES, within a deadline, a
status line and headers that parse, a body as long as it says; the JSON handler only (never
`fr_trace`, whose answer is a pickle). A socket that does not answer is timed out and named.
Hand-written on `socket` (about 80 lines): urllib3 and requests speak TCP, and a unix-socket
adapter would be the only reason to add one.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

from commprobe.common.errors import InputError

MAX_BYTES = 64 << 20  # a ring of 20,000 entries with frames is a few MB
HANDLERS = ("fr_trace_json", "dump_traceback", "ping")
_TCP = re.compile(r"^(127\.0\.0\.1|localhost|\[::1\]):(\d{1,5})$")


class EndpointError(InputError):
    """A rank's endpoint that did not answer as a worker server does: one line naming it."""


def is_tcp(target: str) -> bool:
    return bool(_TCP.match(target))


def _connect(target: str, deadline: float) -> socket.socket:
    m = _TCP.match(target)
    if m:
        host = "::1" if m.group(1) == "[::1]" else "127.0.0.1"
        s = socket.socket(socket.AF_INET6 if host == "::1" else socket.AF_INET, socket.SOCK_STREAM)
        addr: object = (host, int(m.group(2)))
    elif ":" in target and not Path(target).exists() and not target.startswith("/"):
        raise EndpointError(f"{target}: only unix sockets and 127.0.0.1:PORT are asked (never another host)")
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        addr = target
    s.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        s.connect(addr)
    except OSError as e:
        s.close()
        why = {111: "connection refused: no process serves it (the rank is gone?)", 2: "no such socket",
               13: "permission denied"}.get(e.errno or 0, e.strerror or type(e).__name__)
        raise EndpointError(f"{target}: {why}") from None
    return s


def post(target: str, handler: str, deadline: float) -> bytes:
    """The body of a 200 answer to POST /handler/`handler`; EndpointError in one line otherwise."""
    if handler not in HANDLERS:
        raise EndpointError(f"{handler}: not a handler commprobe asks for")
    s = _connect(target, deadline)
    try:
        s.sendall(f"POST /handler/{handler} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
                  f"Connection: close\r\n\r\n".encode())
        data = bytearray()
        need: int | None = None  # the whole answer's length, once its headers are in
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EndpointError(f"{target}: no complete answer to {handler} before the deadline")
            s.settimeout(left)
            try:
                chunk = s.recv(1 << 16)
            except socket.timeout:
                raise EndpointError(f"{target}: no complete answer to {handler} before the deadline") from None
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_BYTES:
                raise EndpointError(f"{target}: answer to {handler} over {MAX_BYTES >> 20} MB: not a worker server's")
            if need is None:
                need = _length(data, target, handler)
            if need is not None and len(data) >= need:
                break
    except OSError as e:
        raise EndpointError(f"{target}: {e.strerror or type(e).__name__} while reading {handler}") from None
    finally:
        s.close()
    return _body(bytes(data), target, handler)


def _length(data: bytearray, target: str, handler: str) -> int | None:
    """The whole answer's length once its headers are in (None before, or without a length: read
    to the close); EndpointError where it says more than MAX_BYTES."""
    end = data.find(b"\r\n\r\n", 0, 1 << 16)
    if end < 0:
        return None
    m = re.search(rb"(?im)^content-length:\s*(\d{1,20})\s*$", bytes(data[:end]))
    if m is None:
        return None
    n = end + 4 + int(m.group(1))
    if n > MAX_BYTES:
        raise EndpointError(f"{target}: answer to {handler} over {MAX_BYTES >> 20} MB: not a worker server's")
    return n


def _body(data: bytes, target: str, handler: str) -> bytes:
    head, sep, body = data.partition(b"\r\n\r\n")
    status = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    if not sep or status is None:
        raise EndpointError(f"{target}: not an HTTP answer to {handler} ({len(data)} bytes)")
    if status.group(1) != b"200":
        raise EndpointError(f"{target}: {handler} answered HTTP {status.group(1).decode()}")
    m = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    if m is not None:
        n = int(m.group(1))
        if len(body) < n:
            raise EndpointError(f"{target}: {handler}'s answer cut short ({len(body)} of {n} bytes)")
        body = body[:n]
    elif re.search(rb"(?im)^transfer-encoding:", head):
        raise EndpointError(f"{target}: {handler} answered in an encoding a worker server does not use")
    return body


__all__ = ["post", "EndpointError", "is_tcp", "MAX_BYTES", "HANDLERS"]
