"""DDA on CPU shared memory equals gloo; races, chunking, all-to-all, cleanup. Both code paths."""


import pytest
import torch

from commprobe.collectives.dda import SHM_PREFIX, load_library, shm_dir
from commprobe.probe.launch import LaunchError, launch
from tests import workers

PATHS = [pytest.param(False, id="compiled"), pytest.param(True, id="torch-fallback")]
SIZES = [1, 2, 3, 15, 16, 17, 1023, 4097, 65537, 262143, 2 * 1024 * 1024 + 3]  # to 8 MiB of fp32, odd counts
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {"torch.float32": 2e-6, "torch.bfloat16": 1e-2, "torch.float16": 2e-3}


def test_compiled_kernels_build_here():
    lib, why = load_library()
    assert lib is not None, why


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("pure", PATHS)
def test_allreduce_equals_gloo(world, pure):
    sizes = SIZES if not pure else SIZES[:-1]  # the fallback is slow; it gets 1 MiB
    for rows in launch(workers.dda_allreduce_vs_gloo, world, (sizes, DTYPES, pure, 8 << 20), timeout=300):
        for n, dt, diff, mag in rows:
            assert diff <= TOL[dt] * max(1.0, mag), f"world {world} n={n} {dt}: |dda - gloo| = {diff}"


@pytest.mark.parametrize("pure", PATHS)
def test_allreduce_chunks_past_the_buffer(pure):
    for rows in launch(workers.dda_allreduce_vs_gloo, 3, ([1, 4096, 100_003], DTYPES, pure, 4096), timeout=300):
        for n, dt, diff, mag in rows:
            assert diff <= TOL[dt] * max(1.0, mag), f"n={n} {dt}: |dda - gloo| = {diff}"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_thousand_back_to_back_calls_without_barrier(world):
    bad = launch(workers.dda_back_to_back, world, (1000, False, 64 << 10), timeout=300)
    assert bad == [0] * world


def test_back_to_back_fallback():
    assert launch(workers.dda_back_to_back, 3, (200, True, 64 << 10), timeout=300) == [0, 0, 0]


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("pure", PATHS)
def test_all_gather_all_to_all_send_recv_equal_gloo(world, pure):
    for rank, res in enumerate(launch(workers.dda_other_ops, world, (pure, 16 << 10), timeout=300)):
        assert all(res.values()), f"rank {rank}: {res}"


def test_other_ops_with_the_default_slot_equal_gloo():
    """The default 1 MiB slot: all-to-all moves in 256 KiB rounds per peer (pipelined), rows
    a rank keeps for itself are copied a round at a time."""
    for rank, res in enumerate(launch(workers.dda_other_ops, 3, (False, 1 << 20), timeout=300)):
        assert all(res.values()), f"rank {rank}: {res}"


def test_shared_memory_gone_after_exit_and_after_a_kill():
    before = set(shm_dir().glob(f"{SHM_PREFIX}-*"))
    launch(workers.dda_back_to_back, 2, (10, False, 64 << 10), timeout=120)
    with pytest.raises(LaunchError, match="rank 1 failed: killed by SIGKILL"):
        launch(workers.dda_then_die, 2, (1,), timeout=120)
    assert set(shm_dir().glob(f"{SHM_PREFIX}-*")) <= before


def test_fallback_says_why(monkeypatch, capfd):
    from commprobe.collectives import dda

    monkeypatch.setattr(dda, "_LIB", None)
    monkeypatch.setattr(dda, "_LIB_REASON", "")
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr("shutil.which", lambda name: None)
    lib, why = dda.load_library()
    assert lib is None and "no C compiler" in why


def test_gpu_dda_skips_with_a_reason_on_cpu():
    from commprobe.collectives.dda_symm import symm_mem_unavailable_reason

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the symmetric-memory path is checked by bench/gpu_check.py")
    assert "no CUDA" in symm_mem_unavailable_reason()


def test_every_call_is_a_labelled_profiler_span():
    names = launch(workers.spans_under_profiler, 2, (), timeout=120)[0]
    assert names == [
        "commprobe/comm/ep/all_to_all/bytes=48/dtype=float32/group=2/backend=gloo/grank=0/send=24.24/recv=24.24",
        "commprobe/comm/tp/all_reduce/bytes=2000/dtype=bfloat16/group=2/backend=dda",
        "commprobe/comm/tp/send_recv/bytes=20/dtype=float32/group=2/backend=dda",
    ]


def test_default_wait_is_adaptive_while_ranks_fit_the_cores_and_futex_beyond(monkeypatch):
    """The default chosen by bench/wait_modes.py's table: adaptive with a core per rank (quiet or
    beside a busy process), futex once the host's ranks outnumber its cores."""
    from commprobe.collectives import dda

    monkeypatch.setattr(dda, "usable_cores", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert dda.default_wait() == "adaptive"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert dda.default_wait() == "futex"


def test_spin_only_while_the_hosts_ranks_fit_the_cores(monkeypatch):
    """Spin-then-sleep is decided by all of the job's ranks on the host, not the group's size:
    a TP pair of a 4-rank job on 2 cores must sleep at once (spinning, it held the core the
    other pair needed: decode 13-16 % slower)."""
    from commprobe.collectives.dda import DEFAULT_SPIN_US, ranks_on_host, usable_cores

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert ranks_on_host() == 3
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert ranks_on_host() == 1  # no process group, no launcher: this process alone
    want = DEFAULT_SPIN_US if 4 <= usable_cores() else 0.0
    for sub, full in launch(workers.dda_spin_choice, 4, timeout=120):
        assert sub == full == want


@pytest.mark.parametrize("wait", ["futex", "yield", "spin", "adaptive", "spin-futex"])
def test_every_wait_mode_equals_gloo(wait, monkeypatch):
    """How a rank waits changes nothing it computes: each wait mode (COMMPROBE_DDA_WAIT) against
    gloo at one- and two-shot sizes and chunked past the slot, 200 back-to-back calls without a
    barrier, and the other ops; at world 3 so that an odd rank waits for two peers. The allreduces
    run with each rank bound to a core (a sweep's +pin variant; 3 ranks on this host's cores, so two
    may share one): pinning changes nothing computed either."""
    monkeypatch.setenv("COMMPROBE_DDA_WAIT", wait)
    for rows in launch(workers.pinned_dda_allreduce_vs_gloo, 3, ([1, 17, 4097, 65537, 300_001], DTYPES, False, 256 << 10),
                       timeout=300):
        for n, dt, diff, mag in rows:
            assert diff <= TOL[dt] * max(1.0, mag), f"{wait} n={n} {dt}: |dda - gloo| = {diff}"
    assert launch(workers.dda_back_to_back, 3, (200, False, 64 << 10), timeout=300) == [0, 0, 0]
    for rank, res in enumerate(launch(workers.dda_other_ops, 3, (False, 16 << 10), timeout=300)):
        assert all(res.values()), f"{wait} rank {rank}: {res}"


def test_every_wait_mode_honours_the_deadline():
    """A peer that never comes: each mode gives up at its deadline with the peer named (a pure
    spin or yield loop must check the clock too)."""
    modes = ["spin-futex", "futex", "yield", "spin", "adaptive"]
    rows = launch(workers.dda_wait_modes_time_out, 2, (modes, 1.0), timeout=120)[0]
    assert [m for m, _, _ in rows] == modes
    for m, secs, err in rows:
        assert "timed out waiting for group rank 1" in err, (m, err)
        assert 0.9 <= secs <= 4.0, (m, secs)


@pytest.mark.parametrize("raising", [True, False], ids=["KeyboardInterrupt", "quiet-handler"])
def test_ctrl_c_ends_a_wait_at_once_in_every_mode(raising):
    """A rank whose peer never comes, Ctrl-C'd: the wait ends within a second in every mode, not at
    the DDA timeout (30 s here). Python's handler raises KeyboardInterrupt out of the call; a handler
    that does not raise still ends the call, with a DDAError saying why (the C wait loop returns on
    any watched signal, since Python acts on signals only between calls)."""
    modes = ["spin-futex", "futex", "yield", "spin", "adaptive"]
    rows = launch(workers.dda_wait_modes_interrupted, 2, (modes, 30.0, raising), timeout=120)[0]
    assert [m for m, _, _ in rows] == modes
    for m, secs, err in rows:
        want = "KeyboardInterrupt" if raising else "DDAError: DDA all_reduce on axis tp: interrupted by a signal"
        assert err.startswith(want), (m, err)
        assert 0.0 <= secs <= 1.0, (m, secs)


def test_unknown_wait_mode_is_one_line(monkeypatch):
    from commprobe.collectives.dda import DDAComm

    with pytest.raises(ValueError, match="unknown DDA wait mode 'nap'; choose one of spin-futex, futex"):
        DDAComm("tp", wait="nap")
    monkeypatch.setenv("COMMPROBE_DDA_WAIT", "nap")
    with pytest.raises(ValueError, match="unknown DDA wait mode 'nap'"):
        DDAComm("tp")
