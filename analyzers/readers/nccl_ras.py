"""NCCL RAS (`ncclras`, NCCL >= 2.24) status, read: its text (what `ncclras` prints, saved to a
file), its JSON form (`ncclras -f json`, NCCL >= 2.28.7), or asked of its port on 127.0.0.1
(default 28028; the client protocol: "CLIENT PROTOCOL 2", "STATUS", the text until the close).

Read from the formats NCCL's own sources write (src/ras/client_support.cc) and its user guide's
samples (docs/userguide/source/troubleshooting/ras.rst): per communicator (`#G-C (hash)`), the
ranks that gave no data (INCOMPLETE: "The missing rank: 21", or "Rank 21 -- GPU 5 managed by
process P on node H"), collective counts that differ (MISMATCH: "N ranks have launched up to
operation X", then the outliers' "Rank R -- GPU g managed by process P on node H"), statuses
that differ, errors; per job, processes missing or considered dead. What RAS prints varies by
release; lines not recognised are kept, never guessed at.
"""

from __future__ import annotations

import json
import re
import socket
import time

from commprobe.common.errors import InputError

MAX_BYTES = 16 << 20
_COMM = re.compile(r"^#(\d+)-(\d+) \(([0-9a-fA-Fx]+)\) ([A-Z_]+)\s*$")
_RANK = re.compile(r"^\s+Rank (\d+)(?: has (?:launched up to operation (\d+)|not launched any operations|status (\w+)))?"
                   r" -- (?:GPU (\S+) managed by process (\d+) on node (\S+)|\[process information not found\])")
_PROC = re.compile(r"^\s+Process (\d+) on node (\S+) managing GPUs? (\S+)")
_COUNT = re.compile(r"^\s+(\d+) ranks? ha(?:ve|s) (?:launched up to operation (\d+)|not launched any operations)")
_STATUS = re.compile(r"^\s+(\d+) ranks? ha(?:ve|s) status (\w+)")
_MISSING = re.compile(r"^\s+The missing ranks?: ([\d, ]+)")
_WHAT = re.compile(r"^\s+Communicator ranks have different (?:(\w+) )?(operation counts|status)")


class RasError(InputError):
    """RAS output that cannot be read: one line."""


def looks_like(head: bytes) -> bool:
    """Whether a file's first bytes are RAS status (its text or its JSON)."""
    h = head.lstrip()[:4096]
    return h.startswith(b"Job summary") or b"Communicators..." in h or bool(
        re.search(rb"(?m)^Group\s+Comms\s+Nodes|^#\d+-\d+ \([0-9a-fA-F]+\) [A-Z]+\s*$", h)) or (
        h.startswith(b"{") and b'"communicators' in h and b'"nccl_version"' in h)


def parse(data: bytes, source: str) -> dict:
    """{comms: [...], processes: {missing: [...], dead: [...]}, timeouts, source}."""
    if len(data) > MAX_BYTES:
        raise RasError(f"{source}: {len(data) >> 20} MB is not RAS status (limit {MAX_BYTES >> 20} MB)")
    text = data.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            raise RasError(f"{source}: RAS JSON that does not parse") from None
        return _from_json(doc, source)
    return _from_text(text, source)


def _proc(m) -> dict:
    return {"pid": int(m.group(1)), "host": m.group(2)[:200], "gpu": m.group(3)[:40]}


def _from_text(text: str, source: str) -> dict:
    comms: dict[str, dict] = {}
    procs: dict[str, list] = {"missing": [], "dead": []}
    cur: dict | None = None
    section = None  # a job-level block: INCOMPLETE (missing processes), DEAD
    group: dict | None = None  # the "N ranks have ..." block the rank lines below belong to
    timeouts = 0
    for ln in text.splitlines()[:200000]:
        if m := _COMM.match(ln):
            key = f"#{m.group(1)}-{m.group(2)}"
            cur = comms.setdefault(key, {"id": key, "hash": m.group(3).lower(), "errors": [], "missing": [],
                                         "counts": [], "status": [], "lines": []})
            cur["errors"].append(m.group(4))
            section, group = None, None
            continue
        if re.match(r"^(INCOMPLETE|DEAD|TIMEOUT)\s*$", ln):
            cur, group, section = None, None, ln.strip()
            continue
        if not ln.startswith(" "):
            cur, group, section = (None, None, None) if ln.strip() else (cur, group, section)
            continue
        if section and (m := _PROC.match(ln)):
            procs["dead" if section == "DEAD" else "missing"].append(_proc(m))
        elif section == "TIMEOUT" and (m := re.search(r"Encountered (\d+) communication timeout", ln)):
            timeouts += int(m.group(1))
        elif cur is None:
            continue
        elif m := _MISSING.match(ln):
            cur["missing"] += [{"rank": int(r)} for r in re.findall(r"\d+", m.group(1))]
        elif m := _WHAT.match(ln):
            group = None
            cur["what"] = ((m.group(1) or "collective") + " " + m.group(2)) if m.group(2) != "status" else "status"
        elif m := _COUNT.match(ln):
            group = {"ranks_count": int(m.group(1)), "upto": int(m.group(2) or 0), "op": cur.get("what"), "ranks": []}
            cur["counts"].append(group)
        elif m := _STATUS.match(ln):
            group = {"ranks_count": int(m.group(1)), "status": m.group(2), "ranks": []}
            cur["status"].append(group)
        elif m := _RANK.match(ln):
            r = {"rank": int(m.group(1))}
            if m.group(5):
                r.update(gpu=m.group(4)[:40], pid=int(m.group(5)), host=m.group(6)[:200])
            if "INCOMPLETE" in cur["errors"] and group is None and "what" not in cur:
                cur["missing"].append(r)
            elif m.group(2) is not None or "not launched" in ln:  # an outlier of one: its own count
                cur["counts"].append({"ranks_count": 1, "upto": int(m.group(2) or 0), "op": cur.get("what"),
                                      "ranks": [r]})
            elif m.group(3):
                cur["status"].append({"ranks_count": 1, "status": m.group(3), "ranks": [r]})
            elif group is not None:
                group["ranks"].append(r)
        else:
            cur["lines"].append(ln.strip()[:300])
    if not comms and not procs["missing"] and not procs["dead"] and not looks_like(text.encode()[:4096]):
        raise RasError(f"{source}: not NCCL RAS status (no communicators, no job summary)")
    return {"source": source, "comms": list(comms.values()), "processes": procs, "timeouts": timeouts}


def _from_json(doc, source: str) -> dict:
    if not isinstance(doc, dict) or not isinstance(doc.get("communicators"), list):
        raise RasError(f"{source}: RAS JSON without a communicators list")
    comms = []
    for i, c in enumerate(doc["communicators"][:100000]):
        if not isinstance(c, dict):
            continue
        ranks = [r for r in c.get("ranks") or [] if isinstance(r, dict)]
        missing = [{"rank": int(r.get("rank", -1)), "pid": r.get("pid"), "host": str(r.get("host"))[:200],
                    "gpu": str(r.get("cuda_dev")), "dead": bool((r.get("status") or {}).get("considered_dead"))}
                   for r in c.get("missing_ranks") or [] if isinstance(r, dict)]
        counts = []
        ops = sorted({op for r in ranks for op in (r.get("collective_counts") or {})})
        for op in ops:
            by: dict[int, list] = {}
            for r in ranks:
                n = (r.get("collective_counts") or {}).get(op)
                if isinstance(n, int):
                    by.setdefault(n, []).append({"rank": r.get("rank"), "pid": r.get("pid"),
                                                 "host": str(r.get("host"))[:200], "gpu": str(r.get("cuda_dev"))})
            if len(by) > 1:
                counts += [{"ranks_count": len(v), "upto": n, "op": f"{op} operation counts", "ranks": v}
                           for n, v in sorted(by.items(), key=lambda kv: -len(kv[1]))]
        errors = (["INCOMPLETE"] if missing else []) + (["MISMATCH"] if counts else [])
        comms.append({"id": f"#{i}", "hash": str(c.get("hash"))[:40], "errors": errors, "missing": missing,
                      "counts": counts, "status": [], "lines": []})
    dead = [m for c in comms for m in c["missing"] if m.get("dead")]
    return {"source": source, "comms": comms, "processes": {"missing": [], "dead": dead},
            "timeouts": int((doc.get("ras") or {}).get("timeouts_count") or 0)}


def query(target: str, timeout: float = 10.0) -> bytes:
    """RAS status asked of its port (127.0.0.1 or localhost only), as `ncclras` asks it."""
    host, _, port = target.rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        raise RasError(f"{target}: RAS is asked on 127.0.0.1:PORT only (default 28028)")
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=timeout) as s:
            s.sendall(b"CLIENT PROTOCOL 2\n")
            hello = s.recv(4096)
            if not hello.upper().startswith(b"SERVER PROTOCOL "):
                raise RasError(f"{target}: not NCCL RAS (it answered {hello[:40]!r})")
            s.sendall(b"STATUS\n")
            data = bytearray()
            while True:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
                if len(data) > MAX_BYTES:
                    raise RasError(f"{target}: RAS status over {MAX_BYTES >> 20} MB")
    except socket.timeout:
        raise RasError(f"{target}: RAS did not answer within {timeout:g} s") from None
    except OSError as e:
        raise RasError(f"{target}: {e.strerror or type(e).__name__} (is NCCL RAS on? NCCL_RAS_ENABLE)") from None
    return bytes(data)


__all__ = ["parse", "query", "looks_like", "RasError"]
