"""Which windows of a trace are prefill, decode or mixed steps: the phase rules, in order.

A rule names the annotation it reads and the upstream file that writes it. The first rule with a
match on a rank chooses that rank's windows; the analysis records which (`phase_rule`), and per
phase the engine steps it saw with their request and token counts (`engine_steps`). Annotations
that start like a rule's but do not parse are counted (`malformed`), never guessed.

- `commprobe`: our own spans, `commprobe/prefill`, `commprobe/decode[i]` (probe/run.py).
- `vllm-v1`: `execute_context_{R}({T})_generation_{R}({T})` per engine step: requests that
  have not generated a token yet (context: prefill, chunked or not) and requests generating
  (decode), each with its tokens; vllm-project/vllm vllm/v1/worker/gpu_worker.py,
  `Worker.annotate_profile`. Context only: prefill; generation only: decode; both: mixed.
- `vllm-v1-new-cached`: the same method's older form, `execute_new_{N}_cached_{M}`: newly
  scheduled requests and already-running ones. New only: prefill; both: mixed; cached only is
  phase `cached`, because a running request may still be in a chunked prefill: the annotation
  cannot tell decode from a later prefill chunk.
- `profiler-step`: `ProfilerStep#N` (torch.profiler's schedule; torchtitan, training loops): `step`.
- `whole-trace`: nothing matched: one window, `trace`.

SGLang's and TensorRT-LLM's step annotations are not recognised yet: their formats were not
verified against their sources or a real trace, and a guessed phase is worse than none.
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


def _vllm_context(m: re.Match) -> str:
    ctx, gen = int(m.group(1)), int(m.group(3))
    return "mixed" if ctx and gen else "prefill" if ctx else "decode" if gen else "idle-step"


def _vllm_new_cached(m: re.Match) -> str:
    new, cached = int(m.group(1)), int(m.group(2))
    return "mixed" if new and cached else "prefill" if new else "cached" if cached else "idle-step"


RULES = (
    PhaseRule("commprobe", ("commprobe/prefill", "commprobe/decode"), re.compile(r"^commprobe/(prefill|decode)"), lambda m: m.group(1),
              lambda m: {}, "commprobe probe/run.py"),
    PhaseRule("vllm-v1", ("execute_context_",), re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$"),
              _vllm_context,
              lambda m: {"context_requests": int(m.group(1)), "context_tokens": int(m.group(2)),
                         "generation_requests": int(m.group(3)), "generation_tokens": int(m.group(4))},
              "vllm-project/vllm vllm/v1/worker/gpu_worker.py Worker.annotate_profile"),
    PhaseRule("vllm-v1-new-cached", ("execute_new_",), re.compile(r"^execute_new_(\d+)_cached_(\d+)$"), _vllm_new_cached,
              lambda m: {"new_requests": int(m.group(1)), "cached_requests": int(m.group(2))},
              "vllm-project/vllm vllm/v1/worker/gpu_worker.py Worker.annotate_profile (older releases)"),
    PhaseRule("profiler-step", ("ProfilerStep#",), re.compile(r"^ProfilerStep#\d+$"), lambda m: "step", lambda m: {},
              "torch.profiler schedule (torch/profiler/profiler.py)"),
)
