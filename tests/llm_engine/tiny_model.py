"""Writes the real-engine tests' model: a tiny Llama with random weights (hidden 256, 4 layers,
4 heads, vocabulary 1000, 3.1 M parameters) and a word-level tokenizer with a trivial chat
template, so nothing comes from a hub. Run with the engine's Python (it needs ``transformers``
and ``tokenizers``, which the main suite does not): ``python -m tests.llm_engine.tiny_model DIR``
(``--hidden N --layers N`` for a larger one, as the engine benchmark writes).

The end-of-sequence id (1000) lies outside the 1000-logit head, so the model never ends a
sequence early: every request produces exactly ``max_tokens`` tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

VOCAB = 1000
EOS_ID = VOCAB  # outside the head: never sampled
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def write(directory: Path, hidden: int = 256, layers: int = 4) -> None:
    """Write the model (``hidden`` wide, ``layers`` deep, 64-wide heads) and its tokenizer into
    ``directory`` (created)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=EOS_ID,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    directory.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(directory)
    words = ["<unk>", "<s>", "<pad>", *(f"w{i}" for i in range(3, VOCAB))]
    vocab = {word: index for index, word in enumerate(words)}
    vocab["</s>"] = EOS_ID
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="write the real-engine tests' model")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    arguments = parser.parse_args()
    write(arguments.directory, arguments.hidden, arguments.layers)
    print(f"model in {arguments.directory}")
