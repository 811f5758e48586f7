"""What each engine offers against a bottleneck, so advice names the engine's own remedy: an SGLang
operator is told SGLang's knobs, not commprobe's `--backend dda`. One table per engine, each entry
with where it comes from; the engine is the one whose step markers the trace holds (phases.py's
rule), `None` for a trace of no engine (a training job, our own runs: commprobe's own remedies).
"""

from __future__ import annotations

# phases.py rule name -> engine
ENGINE_OF_RULE = {"vllm-v1": "vllm", "vllm-v1-new-cached": "vllm", "sglang": "sglang", "trtllm": "trtllm",
                  "commprobe": "commprobe"}

# (engine, on a device timeline) -> what replaces a latency-bound small TP allreduce
SMALL_ALLREDUCE = {
    ("commprobe", True): "a one-shot DDA allreduce (commprobe --backend dda) replaces the ring's many hops with one "
                         "read per peer",
    ("commprobe", False): "a one-shot DDA allreduce (commprobe --backend dda) replaces the ring's many hops with one "
                          "read per peer",
    # a run of ours already on DDA: advising DDA would send the user to what they run
    ("commprobe-dda", True): "this run already uses DDA's one-shot allreduce: what is left at these sizes is each "
                             "call's fixed cost; make fewer calls (fuse a layer's allreduces) or overlap them with compute",
    ("commprobe-dda", False): "this run already uses DDA's one-shot allreduce: what is left at these sizes is each "
                              "call's fixed cost; make fewer calls (fuse a layer's allreduces) or overlap them with "
                              "compute",
    # sgl-project/sglang python/sglang/srt/distributed/device_communicators/custom_all_reduce.py, pymscclpp.py;
    # server_args.py --disable-custom-all-reduce, --enable-mscclpp
    ("sglang", True): "keep SGLang's custom allreduce on (it is, unless --disable-custom-all-reduce) and, at 8 or 16 "
                      "GPUs, try its MSCCL++ allreduce (--enable-mscclpp): one-shot reads of peers' buffers instead of "
                      "the library's ring",
    # SGLang's CPU backend: sgl_kernel's shm_allreduce on CPUs with AMX (tests/data/traces/sglang-cpu-tp2/README.md),
    # SGLANG_CPU_OMP_THREADS_BIND binding each TP rank's threads to its cores
    ("sglang", False): "use SGLang's CPU shared-memory allreduce (sgl_kernel's shm_allreduce, its CPU engine's path "
                       "on AMX CPUs) instead of gloo, bind each TP rank to cores of its own (SGLANG_CPU_OMP_THREADS_BIND) "
                       "and run no more ranks than cores",
    # vllm-project/vllm vllm/distributed/device_communicators/custom_all_reduce.py; engine arg
    # --disable-custom-all-reduce; CPU: cpu_communicator.py (_C::shm_allreduce), VLLM_CPU_OMP_THREADS_BIND
    ("vllm", True): "keep vLLM's custom allreduce on (it is, unless --disable-custom-all-reduce; it needs P2P/NVLink "
                    "between the GPUs): one-shot reads of peers' buffers instead of the library's ring",
    ("vllm", False): "use vLLM's CPU shared-memory allreduce (its CPU backend's default) and bind each rank's threads "
                     "to cores of its own (VLLM_CPU_OMP_THREADS_BIND); run no more ranks than cores",
    ("trtllm", True): "use a one-shot allreduce strategy for small messages (TensorRT-LLM's custom allreduce) instead "
                      "of the library's ring",
}
GENERIC_SMALL_ALLREDUCE = ("a one-shot allreduce (each rank reads every peer's buffer once: an engine's custom "
                           "allreduce, or commprobe's DDA, `commprobe profile --backend dda`, to measure it) replaces "
                           "the ring's many hops")


def engine_of(rows: list[dict], backend: str | None = None) -> str | None:
    """The engine whose step markers chose the ranks' windows, where one did; our own runs on DDA
    (`backend`, the bundle's) apart, as their remedy is not DDA."""
    rules = {(r.get("phase_rule") or {}).get("rule") for r in rows}
    engines = {ENGINE_OF_RULE.get(x) for x in rules}
    engine = next(iter(engines)) if len(engines) == 1 else None
    return "commprobe-dda" if engine == "commprobe" and backend == "dda" else engine


def small_allreduce(engine: str | None, device: bool) -> str:
    return SMALL_ALLREDUCE.get((engine, device), GENERIC_SMALL_ALLREDUCE)
