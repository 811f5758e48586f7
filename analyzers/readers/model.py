"""The trace model every analyzer reads: one rank's complete events as parallel numpy arrays,
sorted by start time, with the few facts about the file the analysis needs. Every reader (Kineto
JSON, Nsight and rocpd SQLite) fills it; numpy helpers for integer coding live beside it because
every reader and the per-rank pipeline use them.

Times are microseconds since `origin_ns` (Unix ns). A trace's own events are relative to its
`baseTimeNanoseconds`; a set of ranks is rebased onto the earliest base, so ranks of one run
line up, and telemetry stamped with Unix nanoseconds lines up too. (Absolute Unix µs in a
float64 would keep only 0.25 µs of resolution; relative times keep nanoseconds.)
Bad input raises TraceError with one line that names the file and the problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from commprobe.common.errors import InputError

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "Kernel", "Memcpy", "Memset"})
DEVICE_WORK = DEVICE_CATS - {"gpu_user_annotation"}  # what runs on the device (annotations do not)
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})  # host calls that launch device work
# Events whose launch correlation every reader keeps (lower case): device work and the runtime
# calls that launched it. A step's device work is found by it (per_rank/attribution.py).
LAUNCH_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}) | RUNTIME_CATS


INT64 = (-(1 << 63), (1 << 63) - 1)


def int64_row(values) -> bool:
    """Whether every value is an integer int64 holds (not a bool, NULL, text, real or a bigger
    number): the readers' one check on numbers from a file, before numpy sees them."""
    lo, hi = INT64
    return all(type(v) is int and lo <= v <= hi for v in values)


_SKIPPED: dict[str, dict[str, int]] = {}  # input path -> table or list -> rows a checked boundary skipped


def count_skipped(path, where: str, n: int) -> None:
    """A reader's checked boundary left out `n` rows of `where` in `path` (said in the reader notes)."""
    per = _SKIPPED.setdefault(str(path), {})
    per[where] = per.get(where, 0) + n


def skipped_rows(path) -> dict[str, int]:
    """Rows the boundary skipped in this input, per table (and forgets them)."""
    return _SKIPPED.pop(str(path), {})


class TraceError(InputError):
    """A trace (or directory of traces) that cannot be analyzed; the message is one line."""

@dataclass
class Trace:
    """Complete ('X') events of one rank, as parallel arrays sorted by start time."""

    path: str
    rank: int
    ts: np.ndarray  # float64 µs since origin_ns
    dur: np.ndarray  # float64 µs
    name_id: np.ndarray  # int32 into names
    cat_id: np.ndarray  # int32 into cats
    names: list[str]
    cats: list[str]
    tid_id: np.ndarray  # int32: one id per distinct thread (or stream) of the trace
    arg_row: np.ndarray  # int32 into arg_dicts; -1 for events whose args were not read
    arg_dicts: list[dict]  # distinct ARG_KEYS subsets of communication candidates' args
    arg_seq: np.ndarray  # int64: the collective's sequence number in its process group (args "Seq"), -1 unknown
    arg_corr: np.ndarray  # int64: the launch correlation id (args "correlation") of device work and runtime calls, -1 unknown
    origin_ns: int
    distributed: dict | None
    commprobe: dict | None
    uncompressed_bytes: int
    extra: dict = field(default_factory=dict)
    a2a_args: dict = field(default_factory=dict)  # event -> args of torch's all-to-all ops (split sizes), Kineto
    _device: np.ndarray | None = field(default=None, repr=False)
    _work: np.ndarray | None = field(default=None, repr=False)

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def is_device(self) -> np.ndarray:
        """Events on a device timeline (kernels, copies); computed once, every analyzer asks."""
        if self._device is None:
            dev = np.array([c in DEVICE_CATS for c in self.cats], dtype=bool)
            self._device = dev[self.cat_id] if len(self.cats) else np.zeros(0, bool)
        return self._device

    def is_device_work(self) -> np.ndarray:
        """Events that run on the device (kernels, copies, memsets; not GPU-side annotations);
        computed once (graph facts and step windows both ask)."""
        if self._work is None:
            work = np.array([c in DEVICE_WORK for c in self.cats], dtype=bool)
            self._work = work[self.cat_id] if len(self.cats) else np.zeros(0, bool)
        return self._work

    def args(self, i: int) -> dict:
        """The ARG_KEYS fields of event i's args ({} where absent or not read)."""
        r = int(self.arg_row[i])
        return self.arg_dicts[r] if r >= 0 else {}

    def events_named(self, idx: np.ndarray, pred: Callable[[str], bool]) -> np.ndarray:
        """Which of the events `idx` have a name for which `pred` holds (tested once per name)."""
        flags = np.fromiter(map(pred, self.names), bool, len(self.names))
        return flags[self.name_id[idx]] if len(self.names) else np.zeros(len(idx), bool)

_RANK_IN_NAME = re.compile(r"rank[-_]?([0-9]+)", re.IGNORECASE)


def ascii_number(text: str | None) -> int | None:
    """A captured group as a number where it is one in ASCII digits, else None. str.isdigit() and
    `\\d` also take other scripts' digits and superscripts ('²', whose int() raises; '٣', which
    int() reads as 3): a rank or pid in a file name is written in ASCII."""
    return int(text) if text and text.isascii() and text.isdigit() else None


def rank_in_name(name: str) -> int | None:
    """The rank a file name carries (`rank-3`, `rank_3`, `rank3`), or None: every reader's last
    resort when the trace records no rank."""
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


# `<host>_<pid>` at the start of a file name: Nsight's `%h_%p` output pattern and torch.profiler's
# default worker name (tensorboard_trace_handler: f"{socket.gethostname()}_{os.getpid()}"). Host names
# hold no underscore (RFC 952/1123), so the first underscore ends the host.
_HOST_PID = re.compile(r"^([A-Za-z0-9][A-Za-z0-9.-]{0,252})_([0-9]{1,10})(?=[._-]|$)")


def host_pid_in_name(name: str) -> tuple[str | None, int | None]:
    """(host, pid) from a `<host>_<pid>...` file name, else (None, None)."""
    m = _HOST_PID.match(name)
    return (m.group(1), int(m.group(2))) if m else (None, None)


def evidence(file_name: str, own: int | None, own_from: str | None = None, host: str | None = None,
             pid: int | None = None, device: int | None = None, part: int = 0) -> dict:
    """What tells one trace's rank, as `Trace.extra["identity"]`: the trace's own record of it (`own`,
    with where it was read), a rank its file name carries, the host (the export's own record, else the
    file name), the process and the device index; `part`: its place among the ranks of one file. The
    set's rule is chosen across all traces at once (cross_rank/identity.py): one trace alone cannot
    tell whether its device index repeats on another node."""
    name_host, name_pid = host_pid_in_name(file_name)
    return {"file": file_name, "own": own if isinstance(own, int) and not isinstance(own, bool) else None,
            "own_from": own_from, "name_rank": rank_in_name(file_name), "host": host or name_host,
            "pid": pid if pid is not None else name_pid, "device": device, "part": part}


def codes(values: np.ndarray, space: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) for integers, in O(n) with a lookup table where they
    span a small range (name x cat keys, string ids, kinds); `space`: the values are known to lie
    in [0, space), which spares the min/max pass."""
    if not len(values):
        return values[:0], np.zeros(0, np.int32)
    lo, hi = (0, space - 1) if space is not None else (int(values.min()), int(values.max()))
    if hi - lo > 1 << 24:
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq, inverse.reshape(-1)
    rel = values - lo if lo else values
    seen = np.zeros(hi - lo + 1, bool)
    seen[rel] = True
    uniq = np.flatnonzero(seen)
    lut = np.zeros(len(seen), np.int32)
    lut[uniq] = np.arange(len(uniq), dtype=np.int32)
    return uniq + lo, lut[rel]


def factorize(values: list) -> tuple[np.ndarray, list]:
    """Integer codes for a list of hashables (in order of first appearance), with the distinct
    values; C-level dict lookups only."""
    table = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return np.fromiter(map(table.__getitem__, values), np.int64, len(values)), list(table)


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of an integer matrix in lexicographic order, and each row's index among
    them: np.unique(a, axis=0, return_inverse=True), by one lexsort (np.unique sorts the rows as
    structured records: 15 ms for 3,700 rows of 9 columns, ~50x this)."""
    if not len(a):
        return a[:0], np.zeros(0, np.int64)
    order = np.lexsort(a.T[::-1])
    s = a[order]
    new = np.ones(len(s), bool)
    new[1:] = (s[1:] != s[:-1]).any(axis=1)
    inverse = np.empty(len(s), np.int64)
    inverse[order] = np.cumsum(new) - 1
    return s[new], inverse
