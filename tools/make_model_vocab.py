"""The tokenizers tools/make_model.py writes into its files: tokenizer.ggml.* keys of exactly n_vocab tokens.

bpe: GPT-2 style byte-level BPE trained on tiny Shakespeare (needs the tokenizers package); spm: SentencePiece BPE
with byte fallback trained on it (sentencepiece); synthetic: GPT-2 byte tokens, the special tokens and filler (the big
shape presets). Each architecture's special tokens and chat template are those of the models it stands for.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
LFM2 = ("lfm2", "lfm2moe")  # the LFM2 layer layout

HARMONY_TEMPLATE = (  # gpt-oss's turns, without its channels and tools
    "{%- for message in messages %}"
    "{{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# llama.cpp token types
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6


def _shakespeare() -> str:
    for p in (REPO / "tests/data/tinyshakespeare.txt", REPO.parent / "shared/data/tinyshakespeare.txt"):
        if p.exists():
            return p.read_text(encoding="utf-8")
    raise FileNotFoundError("tinyshakespeare.txt not found in tests/data/ or ../shared/data/")


def _gpt2_byte_chars() -> list[str]:
    """GPT-2's printable stand-in character for each byte 0..255."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def _specials(arch: str) -> tuple[list[str], str, str, bool, str]:
    """(special tokens, bos, eos, add_bos, chat template)"""
    if arch == "llama":
        sp = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        return sp, "<|begin_of_text|>", "<|eot_id|>", True, LLAMA3_TEMPLATE
    if arch == "gemma3":  # no template: as in Gemma 3 270M's file, the architecture implies Gemma's turns
        sp = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
        return sp, "<bos>", "<end_of_turn>", True, ""
    if arch == "gpt-oss":
        sp = ["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>"]
        return sp, "<|startoftext|>", "<|return|>", False, HARMONY_TEMPLATE
    if arch in LFM2:
        sp = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        return sp, "<|startoftext|>", "<|im_end|>", True, "{{- bos_token }}" + CHATML_TEMPLATE
    sp = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    return sp, "<|endoftext|>", "<|im_end|>", False, CHATML_TEMPLATE


def _synthetic_bpe() -> tuple[list[str], list[str]]:
    """GPT-2 byte tokens plus merges for "Ġ" + letter and every lower-case letter pair."""
    tokens = _gpt2_byte_chars()
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    merges = [f"\u0120 {c}" for c in letters] + [f"{x} {y}" for x in letters for y in letters]
    tokens += [m.replace(" ", "") for m in merges]
    return tokens, merges


@functools.lru_cache(maxsize=None)
def _train_bpe(vocab_size: int, specials: tuple[str, ...]) -> tuple[list[str], list[str]]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import json
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    text = _shakespeare()
    tok.train_from_iterator([text[i:i + 4096] for i in range(0, len(text), 4096)], trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


@functools.lru_cache(maxsize=None)
def _train_spm(vocab_size: int) -> tuple[list[str], list[float], list[int]]:
    import io
    import sentencepiece as spm
    text = _shakespeare()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, num_threads=1, split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2, add_dummy_prefix=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", hard_vocab_limit=False)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    n = sp.get_piece_size()

    def ttype(i):
        return (TT_UNKNOWN if sp.is_unknown(i) else TT_CONTROL if sp.is_control(i) else
                TT_UNUSED if sp.is_unused(i) else TT_BYTE if sp.is_byte(i) else TT_NORMAL)
    return ([sp.id_to_piece(i) for i in range(n)], [float(sp.get_score(i)) for i in range(n)],
            [ttype(i) for i in range(n)])


def tokenizer_metadata(kind: str, arch: str, n_vocab: int) -> dict:
    """tokenizer.ggml.* keys for a tokenizer of exactly n_vocab tokens (padded with <unused{i}> tokens).

    bpe: GPT-2 style byte-level BPE trained on tiny Shakespeare (tokenizer.ggml.model = gpt2, pre = gpt-2)
    spm: SentencePiece BPE with byte fallback trained on tiny Shakespeare (tokenizer.ggml.model = llama)
    synthetic: GPT-2 byte tokens + special tokens + filler, no merges (for the big shape presets)
    """
    specials, bos, eos, add_bos, template = _specials(arch)
    md: dict = {}
    if kind in ("bpe", "synthetic"):
        if kind == "bpe":
            tokens, merges = _train_bpe(min(n_vocab, 32768), tuple(specials))
            tokens, merges = list(tokens), list(merges)
        else:
            tokens, merges = _synthetic_bpe()
        types = [TT_NORMAL] * len(tokens)
        tokens += specials
        types += [TT_CONTROL] * len(specials)
        md["tokenizer.ggml.model"] = "gpt2"
        # llama.cpp's names (it refuses "gpt2")
        md["tokenizer.ggml.pre"] = "lfm2" if arch in LFM2 else "gpt-4o" if arch == "gpt-oss" else "gpt-2"
        md["tokenizer.ggml.merges"] = merges
        scores = None
    elif kind == "spm":
        tokens, scores, types = (list(v) for v in _train_spm(min(n_vocab, 8000) - len(specials)))
        # the special tokens of the chat template become control tokens
        tokens += specials
        scores += [0.0] * len(specials)
        types += [TT_CONTROL] * len(specials)
        bos, eos = "<s>", "</s>"
        md["tokenizer.ggml.model"] = "llama"
    else:
        raise ValueError(f"unknown tokenizer {kind}")
    if len(tokens) > n_vocab:
        raise ValueError(f"tokenizer has {len(tokens)} tokens, more than --n-vocab {n_vocab}")
    n_pad = n_vocab - len(tokens)
    tokens += [f"<unused{i}>" for i in range(n_pad)]
    types += [TT_UNUSED] * n_pad
    if scores is not None:
        scores += [-1e9] * n_pad
        md["tokenizer.ggml.scores"] = np.array(scores, dtype=np.float32)
    md["tokenizer.ggml.tokens"] = tokens
    md["tokenizer.ggml.token_type"] = np.array(types, dtype=np.int32)
    md["tokenizer.ggml.bos_token_id"] = tokens.index(bos)
    md["tokenizer.ggml.eos_token_id"] = tokens.index(eos)
    if kind == "spm":
        md["tokenizer.ggml.unknown_token_id"] = 0
    if arch == "llama" and kind != "spm":
        md["tokenizer.ggml.eot_token_id"] = tokens.index("<|eot_id|>")
    md["tokenizer.ggml.add_bos_token"] = add_bos if kind != "spm" else True
    md["tokenizer.ggml.add_eos_token"] = False
    if template:
        md["tokenizer.chat_template"] = template
    return md
