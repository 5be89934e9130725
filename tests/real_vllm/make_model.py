"""Build the tiny Llama model the real-vLLM tier serves: random weights, a tokenizer trained here, nothing downloaded.

Seeded, so every machine builds the same files. Small enough to load in a
minute on two CPU cores, big enough in vocabulary (24k) that a tool drawing
token ids blindly (``guardian tune``) is caught.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB = 24000
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def corpus(seed: int = 7, words: int = 400_000) -> list[str]:
    """Pseudo-words over a skewed alphabet: enough distinct pairs for BPE to learn a 24k vocabulary."""
    rnd = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [1 / (i + 1.5) for i in range(len(letters))]
    lines, line = [], []
    for _ in range(words):
        line.append("".join(rnd.choices(letters, weights, k=rnd.randint(2, 9))))
        if len(line) >= 16:
            lines.append(" ".join(line))
            line = []
    return lines


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=0, eos_token_id=1, torch_dtype="bfloat16", tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "guardian-tiny.json").write_text(json.dumps({"vocab_size": tok.get_vocab_size(), "seed": 0}) + "\n")


if __name__ == "__main__":
    build(Path(sys.argv[1]))
