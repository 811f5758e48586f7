"""A Kineto event's args, read by one rule in both readers (the C scanner and msgspec): only
the keys analyzers use, escaped keys decoded, the last of a repeated key wins, members nobody
reads skipped unread; and which names' args are read at all (the vocabulary's name hints)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import msgspec
import numpy as np

from commprobe.common.vocab import LAUNCH_HINT, NAME_HINTS

from .model import TraceError, unique_rows


def _decode_values(path: Path, raws: list[bytes]) -> list:
    """Args values the scanner kept, decoded once each; JSON's rules: invalid UTF-8 or a number
    beyond double's range (1e400) is invalid input, as it is for the msgspec path."""
    try:
        return msgspec.json.decode(b"[" + b",".join(raws) + b"]") if raws else []
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise TraceError(f"{path}: invalid JSON in an event's args ({e})") from None


# The only args fields any analyzer reads (classify: the collective and its process group), and,
# only for events that record neither "In msg nelems" nor "dtype" (`nccl:all_to_all` in older
# PyTorch), their first input's dims and type: the message size (they differ on every call, so
# reading them for every event would multiply the distinct args subsets).
BASE_KEYS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name",
             "Process Group Description")
INPUT_KEYS = ("Input Dims", "Input type")
ARG_KEYS = BASE_KEYS + INPUT_KEYS


# Per event, kept as numbers apart (they differ on every call, so they are no part of a shared subset):
SEQ_KEY = "Seq"  # the collective's sequence number in its process group
CORR_KEY = "correlation"  # links a kernel to the runtime call that launched it (Kineto)
# Read only for torch's all-to-all ops (c10d::alltoall*): with record_shapes, "Concrete Inputs" holds
# the split sizes (per_rank/traffic.py), and the inputs' dims and type give the row's bytes.
A2A_KEYS = ("Concrete Inputs", *INPUT_KEYS)
# ... and for NCCL's all-to-all (record_param_comms, its kernels): torch's split sizes in rows, as
# JSON strings ("[1, 2]"), beside the message's element count and dtype.
SPLIT_KEYS = ("In split size", "Out split size", "In msg nelems", "Out msg nelems", "dtype")
_ALL_KEYS = (*ARG_KEYS, SEQ_KEY, CORR_KEY, "Concrete Inputs", "In split size", "Out split size")


class _Args(msgspec.Struct, gc=False, rename={f"k{i}": k for i, k in enumerate(_ALL_KEYS)}):
    """The args members any analyzer reads, raw; others are skipped unread (as the scanner skips them)."""

    k0: msgspec.Raw = msgspec.Raw(b"")
    k1: msgspec.Raw = msgspec.Raw(b"")
    k2: msgspec.Raw = msgspec.Raw(b"")
    k3: msgspec.Raw = msgspec.Raw(b"")
    k4: msgspec.Raw = msgspec.Raw(b"")
    k5: msgspec.Raw = msgspec.Raw(b"")
    k6: msgspec.Raw = msgspec.Raw(b"")
    k7: msgspec.Raw = msgspec.Raw(b"")
    k8: msgspec.Raw = msgspec.Raw(b"")
    k9: msgspec.Raw = msgspec.Raw(b"")
    k10: msgspec.Raw = msgspec.Raw(b"")
    k11: msgspec.Raw = msgspec.Raw(b"")
    k12: msgspec.Raw = msgspec.Raw(b"")
    k13: msgspec.Raw = msgspec.Raw(b"")


_ARGS = msgspec.json.Decoder(_Args)


def select(path: Path, raws: list[bytes], keys: tuple[str, ...]) -> tuple[np.ndarray, list[bytes]]:
    """Per args object (raw JSON), the raw values of `keys` as ids into the returned distinct raw
    values (-1: absent). JSON's rules, as the scanner's args_fields keeps them: escaped keys are the
    same key, the last of a repeated key counts, args that are not an object have no members, and
    members nobody reads are skipped unread (invalid UTF-8 or 1e400 there is no error)."""
    attrs = [f"k{_ALL_KEYS.index(k)}" for k in keys]
    out = np.full((len(raws), len(keys)), -1, np.int32)
    table: dict[bytes, int] = {}
    for i, r in enumerate(raws):
        try:
            a = _ARGS.decode(r)
        except msgspec.ValidationError:
            continue
        except (msgspec.DecodeError, RecursionError) as e:
            raise TraceError(f"{path}: invalid JSON in an event's args ({e})") from None
        for j, attr in enumerate(attrs):
            v = bytes(getattr(a, attr))
            if v:
                out[i, j] = table.setdefault(v, len(table))
    return out, list(table)


def corr_values(ids: np.ndarray, raws: list[bytes]) -> np.ndarray:
    """Correlation ids from raw values, the scanner's rule: an integer token of 1 to 18 digits, else -1."""
    vals = np.array([int(r) if 1 <= len(r) <= 18 and r.isdigit() else -1 for r in raws] or [-1], np.int64)
    return np.where(ids >= 0, vals[np.maximum(ids, 0)], -1).astype(np.int64)


IN_COL, DT_COL = BASE_KEYS.index("In msg nelems"), BASE_KEYS.index("dtype")


def arg_rows(path: Path, ids: np.ndarray, raws: list[bytes]) -> tuple[np.ndarray, list[dict], np.ndarray]:
    """Both readers' last step: ids (n, ARG_KEYS + Seq) into raw values -> a row per event into the
    distinct ARG_KEYS dicts, and Seq. INPUT_KEYS count only where neither "In msg nelems" nor
    "dtype" is given, and only values that count are decoded (so both readers refuse the same)."""
    if not len(ids):
        return np.zeros(0, np.int32), [], np.zeros(0, np.int64)
    ids = ids.copy()
    ids[(ids[:, IN_COL] >= 0) | (ids[:, DT_COL] >= 0), len(BASE_KEYS):len(ARG_KEYS)] = -1
    used = np.unique(ids[ids >= 0])
    remap = np.full(len(raws) + 1, -1, np.int64)
    remap[used] = np.arange(len(used))
    ids = np.where(ids >= 0, remap[np.maximum(ids, 0)], -1)
    values = _decode_values(path, [raws[i] for i in used.tolist()])
    rows, inverse = unique_rows(ids[:, :-1])
    dicts = [{k: values[v] for k, v in zip(ARG_KEYS, row.tolist()) if v >= 0} for row in rows]
    return inverse.astype(np.int32), dicts, _pick(ids[:, -1], _int_column(values))

def _int_column(values: list) -> np.ndarray:
    """Non-negative integers as int64, -1 where absent or not an integer."""
    return np.fromiter((v if v.__class__ is int and 0 <= v < 1 << 63 else -1 for v in values), np.int64, len(values))


def _pick(ids: np.ndarray, column: np.ndarray) -> np.ndarray:
    """Per event, the int64 of value id `ids` (-1: absent) in `column`."""
    return np.where(ids >= 0, column[np.maximum(ids, 0)] if len(column) else -1, -1).astype(np.int64)


HINT_RE = re.compile(b"|".join(re.escape(h.encode()) for h in NAME_HINTS))  # one pass in C, not a test per hint


@lru_cache(maxsize=1 << 16)  # ranks of one program share their names: decided once per process
def args_kind(name: str) -> int:
    """1: a communication candidate (args read); 2: a kernel or graph launch (correlation only); 0."""
    low = name.encode("utf-8", "surrogatepass").lower()  # ASCII case only, as the scanner matches hints
    return 1 if HINT_RE.search(low) else 2 if LAUNCH_HINT.encode() in low else 0


def field_dicts(path: Path, idx: np.ndarray, ids: np.ndarray, raws: list[bytes], keys: tuple[str, ...]) -> dict[int, dict]:
    """{event: {key: decoded value}} for the events `idx` whose value ids (n, len(keys)) are `ids`."""
    values = _decode_values(path, raws)
    return {int(e): {k: values[v] for k, v in zip(keys, row.tolist()) if v >= 0}
            for e, row in zip(idx.tolist(), ids) if (row >= 0).any()}
