"""A tiny random Llama for a real vLLM engine in the tests (head_dim 64: vLLM's CPU attention has no
kernel for 16): HF config + safetensors weights and a
tokenizer trained offline with `tokenizers` (no hub); with --moe a tiny Mixtral (4 experts, top 2), for
which vLLM creates its EP group and names each worker's trace by its coordinates. Run with the vLLM
venv's python (tests/vllm_venv.sh), which has transformers, tokenizers and safetensors.

    python tests/tiny_llama.py OUT_DIR [--moe]
"""

from __future__ import annotations

import sys
from pathlib import Path

WORDS = ("the model splits layers across ranks and every layer ends in an allreduce of its output "
         "decode steps are small and latency bound while prefill steps are large and compute bound "
         "tensor parallel context parallel expert parallel all to all ring attention kv cache").split()


def main() -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, PreTrainedTokenizerFast

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)
    torch.manual_seed(0)
    common = dict(vocab_size=256, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, bos_token_id=1, eos_token_id=2, torch_dtype="float32",
                  tie_word_embeddings=False)
    if "--moe" in sys.argv[2:]:
        model = MixtralForCausalLM(MixtralConfig(intermediate_size=256, num_local_experts=4, num_experts_per_tok=2,
                                                 **common))
    else:
        model = LlamaForCausalLM(LlamaConfig(intermediate_size=512, **common))
    model.save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    main()
