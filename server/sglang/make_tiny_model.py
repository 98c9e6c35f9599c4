"""Build a tiny Qwen2-style model directory offline (no hub, no weights).

    python -m topas_agents.server.sglang.make_tiny_model DIR [--vocab 512] [--context 8192]

Writes `config.json` (Qwen2ForCausalLM: 2 layers, hidden 256, 4 heads of dim 64 -- a head
size every GPU attention backend supports -- 2 KV heads), a
byte-level BPE `tokenizer.json` trained on a few built-in strings with the ChatML specials,
`tokenizer_config.json` and `chat_template.jinja`. Serve it with `--load-format dummy`
(random weights), so no weight file is needed. Needs `tokenizers` and `transformers`
(both come with SGLang).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_CORPUS = [
    "You are a helpful assistant. Plan the work, write the code, review it and test it.",
    "The product manager writes requirements; the architect designs; engineers implement.",
    "def main():\n    return sum(range(10))\n",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>-_+=*/\\|@#$%^&~`",
]


def model_config(vocab: int, context: int) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": vocab,
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": context, "max_window_layers": 2,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "use_sliding_window": False, "sliding_window": None,
        "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0, "initializer_range": 0.02,
    }


def build_tokenizer(vocab: int) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, chat_template=CHAT_TEMPLATE,
                                   model_max_length=10**9)


def build(out: Path, vocab: int = 512, context: int = 8192) -> Path:
    """Write the model directory; returns it. Every token id is < `vocab`."""
    if vocab < 300:
        raise ValueError("vocab must be >= 300 (256 byte tokens + specials + merges)")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab)
    tokenizer.save_pretrained(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    cfg = model_config(vocab, context)
    cfg["eos_token_id"] = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cfg["bos_token_id"] = cfg["pad_token_id"] = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": cfg["eos_token_id"], "bos_token_id": cfg["bos_token_id"]}, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--context", type=int, default=8192)
    args = p.parse_args(argv)
    print(build(args.out, args.vocab, args.context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
