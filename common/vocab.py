"""The words every package shares about communication, defined once: time categories, parallel
axes, how an axis was decided, the analyzer's verdict labels, collective op names and their bus
factors, and the one list of name hints that decides which events' args the trace scanner keeps
and which names the classifier tests against its kernel table.

It imports nothing but the standard library's enum, so the readers, the per-rank pipeline, the
cross-rank step, the gate and the renderers can all use it without an import circle. A name
written out elsewhere (a category in a report, a verdict compared as a literal) drifts; these do
not.
"""

from __future__ import annotations

import enum


class Category(enum.IntEnum):
    """Where a moment of a rank's time goes. The value is the code in the analyzers' per-event
    arrays; the lower-case name is the key in the JSON result."""

    COMPUTE = 0
    TP_ALLREDUCE = 1
    CP_RING = 2
    EP_ALL_TO_ALL = 3
    OTHER_COMM = 4
    MEMCPY = 5
    OTHER = 6
    MARKER = 7  # annotations (steps, phases, our ring-step spans): windows, never work

    @property
    def key(self) -> str:
        return self.name.lower()


CATEGORIES = [c.key for c in Category]  # the JSON keys, in code order
WORK_CATEGORIES = tuple(CATEGORIES[:Category.MARKER])  # what time is attributed to (markers are not work)
COMM_CODES = (Category.TP_ALLREDUCE, Category.CP_RING, Category.EP_ALL_TO_ALL, Category.OTHER_COMM)
COMM_CATS = tuple(CATEGORIES[c] for c in COMM_CODES)
CATEGORY_LABEL = {"tp_allreduce": "TP allreduce", "cp_ring": "CP ring attention", "ep_all_to_all": "EP all-to-all",
                  "other_comm": "other communication", "compute": "compute", "memcpy": "memcpy", "other": "other"}

AXES = ("tp", "cp", "ep", "dp", "other")  # "other": communication of no known parallel axis
AXIS_OF = {"tp_allreduce": "tp", "cp_ring": "cp", "ep_all_to_all": "ep", "other_comm": "other"}
A2A_WORDS = {"ep": "EP all-to-all", "cp": "CP all-to-all (sequence-parallel attention)"}


def a2a_words(axis: str | None) -> str:
    """What an all-to-all is, by the axis its calls were classified to: EP's (experts) or CP's
    (sequence-parallel attention, Ulysses-style); an all-to-all of no known axis otherwise."""
    return A2A_WORDS.get(axis or "", "all-to-all")


class AxisSource(enum.IntEnum):
    """How a collective's axis was decided (the analyzers' per-event codes; NONE: not a collective)."""

    NONE = 0
    DECLARED = 1  # our own spans, or a process group whose name or description says the axis
    INFERRED = 2  # from the op alone (allreduce -> TP, all-to-all -> EP, a gradient hook -> DP)
    UNKNOWN = 3  # a bare send/recv or a kernel that names no collective


AXIS_SOURCES = ["", "declared", "inferred", "unknown"]  # the JSON words, by AxisSource code


class Verdict(enum.StrEnum):
    """The analyzer's label for a phase (and only that: the cost model writes a summary, the gate a
    metric status)."""

    COMMUNICATION = "communication-bound"  # the collectives' own transfer (or transfer vs waiting not told)
    IMBALANCE = "imbalance-bound"  # waiting in collectives for a late rank: the fix is that rank, not the collective
    MIXED = "communication/imbalance-bound"  # transfer and waiting both, neither alone past the threshold or both
    COMPUTE = "compute-bound"
    DATA_MOVEMENT = "data-movement-bound"  # copies and memsets dominate: not compute
    HOST = "host/launch-bound"
    UNKNOWN = "unknown"

    @property
    def css(self) -> str:
        """A class name for the label (HTML): its first word."""
        return self.value.split("/")[0].split("-")[0]


# Copy directions as each producer names its copies: Kineto and Nsight (`Memcpy HtoD (Pageable ->
# Device)`, CUPTI's copy kinds), rocprofv3 (`MEMORY_COPY_HOST_TO_DEVICE`), RPD (`CopyHostToDevice`).
COPY_DIRECTIONS = (
    ("H2D", ("HtoD", "HOST_TO_DEVICE", "HostToDevice")),
    ("D2H", ("DtoH", "DEVICE_TO_HOST", "DeviceToHost")),
    ("D2D", ("DtoD", "DEVICE_TO_DEVICE", "DeviceToDevice")),
    ("peer", ("PtoP", "PEER", "Peer")),
    ("memset", ("Memset", "memset", "MEMSET", "Fill")),
)


def copy_direction(name: str) -> str:
    """H2D, D2H, D2D, peer, memset, or other: the direction a copy's name says."""
    for label, marks in COPY_DIRECTIONS:
        if any(m in name for m in marks):
            return label
    return "other"


# Every spelling of a collective that torch, NCCL, gloo, MPI or our own spans write, to one op name.
OP_ALIASES = {
    "allreduce": "allreduce", "all_reduce": "allreduce", "allreduce_coalesced": "allreduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor": "all_gather",
    "allgather_coalesced": "all_gather", "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all",
    "alltoallv": "all_to_all", "all_to_allv": "all_to_all", "_broadcast_oop": "broadcast", "_reduce_oop": "reduce",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "send": "send_recv", "recv": "send_recv", "recv_": "send_recv", "sendrecv": "send_recv", "send_recv": "send_recv",
    "recv_any_source": "send_recv", "batch_isend_irecv": "send_recv", "barrier": "barrier", "monitored_barrier": "barrier",
    "bcast": "broadcast", "isend": "send_recv", "irecv": "send_recv",
}

# busbw = algbw x factor (nccl-tests' PERFORMANCE.md): the share of the data each rank's link carries.
_BUS_FACTORS = {"allreduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}


def bus_factor(op: str, n: int) -> float:
    f = _BUS_FACTORS.get(op)
    return f(n) if f and n > 1 else 1.0


# The one list of name hints (lower case; a name is hinted when it contains one, ASCII case
# ignored). The scanner keeps the args and correlation id of every hinted name (classify needs
# them: the collective, group, size, Seq, and the launch link), and classify tests only hinted
# names against comm_kernels.toml's regexes (a C-speed prefilter that spares them the long C++
# template names of compute kernels). Every kernel pattern in comm_kernels.toml needs one of
# KERNEL_HINTS in the names it matches (tests/test_vocab.py checks each table entry's examples).
HOST_OP_HINTS = ("reduce", "gather", "scatter", "all_to_all", "alltoall", "broadcast", "barrier", "send", "recv",
                 "record_param_comms", "c10d", "gloo:", "mpi:", "ucc:", "dispatch", "combine", "notify", "symm_mem",
                 "multimem", "commprobe/comm", "bcast")
KERNEL_HINTS = ("nccl", "rccl", "all_reduce", "allreduce", "all_gather", "allgather", "deep_ep", "mscclpp", "dda",
                "commprobe", "cross_device_reduce", "lamport", "ep::", "internode", "intranode", "get_dispatch_layout",
                "nvshmem", "mori", "shm_")
NAME_HINTS = tuple(dict.fromkeys((*HOST_OP_HINTS, *KERNEL_HINTS)))
LAUNCH_HINT = "launch"  # cudaLaunchKernel, cuLaunchKernel, hipLaunchKernel, cudaGraphLaunch, ...: correlation only


def category_for(op: str | None, axis: str | None) -> int:
    """TP allreduces; everything on the CP axis is ring attention (ring send/recv, pass-Q's
    all-to-all return, CP decode's all-gather of partials); EP dispatch/combine all-to-alls
    and the MoE's all-gather that re-replicates tokens are EP traffic."""
    if op == "allreduce" and axis == "tp":
        return int(Category.TP_ALLREDUCE)
    if axis == "cp" and op in ("send_recv", "all_gather", "all_to_all"):
        return int(Category.CP_RING)
    if axis == "ep" and op in ("all_to_all", "all_gather"):
        return int(Category.EP_ALL_TO_ALL)
    return int(Category.OTHER_COMM)

# The backends `commprobe profile` runs (collectives/backends.py resolves them): what a what-if may
# tell a user to profile; a sweep measures more (`bench collectives`: deepspeed too).
PROFILE_BACKENDS = ("auto", "gloo", "nccl", "rccl", "dda")
