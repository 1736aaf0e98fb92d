#!/usr/bin/env python3
"""Train the small test tokenizers and write their fixtures.

Run:  .venv/bin/python tools/train_tokenizers.py [--text PATH] [--out DIR] [--only NAME ...]

Trains on tiny Shakespeare (default ../shared/data/tinyshakespeare.txt relative to the repository root, else the
copy in tests/data/), plus the same lines with numbers in front so that the vocabularies hold digit merges:
  - five byte-level BPE tokenizers with HF `tokenizers` (vocab 2000), one per pre-tokenizer the engine supports:
    bpe_gpt2 (pre "gpt2"), bpe_llama3 ("llama-bpe"), bpe_qwen2 ("qwen2"), bpe_smollm ("smollm"), bpe_gpt4o
    ("gpt-4o": o200k's rules, gpt-oss); qwen2 and smollm reuse the merges learnt under llama3's and gpt2's rules so
    that their one-digit splits matter;
  - one SentencePiece BPE model with byte fallback (vocab 1000): spm ("llama").
Each fixture tests/data/tokenizers/<name>.json holds exactly the fields of the engine's TokenizerData (what a GGUF
converter writes as tokenizer.ggml.*). tests/data/tokenizers/strings.json holds the test strings and
<name>.ref.json the ids the reference library gives for each.

Importing this module has no side effects; `tokenizer_metadata(kind)` returns the tokenizer.ggml.* keys of a
committed fixture for embedding into a GGUF file.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "data" / "tokenizers"
DEFAULT_TEXT = REPO / ".." / "shared" / "data" / "tinyshakespeare.txt"
FALLBACK_TEXT = REPO / "tests" / "data" / "tinyshakespeare.txt"

SEED = 1234
BPE_VOCAB = 2000
SPM_VOCAB = 1000
BPE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# GGUF token types (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer split patterns, as the HF tokenizer.json files of the respective models carry them.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# o200k (GPT-4o, gpt-oss): words split at case changes (an upper-case run, then lower case), contractions kept on them.
GPT4O_PATTERN = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
                 r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
                 r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

# name -> (gguf pre, pre-tokenizer the vocabulary is trained under). qwen2 and smollm reuse the vocabularies
# trained under llama3's and gpt2's rules: those hold multi-digit tokens, so the one-digit splits are exercised.
BPE_KINDS = {
    "bpe_gpt2": ("gpt2", "gpt2"),
    "bpe_llama3": ("llama-bpe", "llama-bpe"),
    "bpe_qwen2": ("qwen2", "llama-bpe"),
    "bpe_smollm": ("smollm", "gpt2"),
    "bpe_gpt4o": ("gpt-4o", "gpt-4o"),
}
SPM_KIND = "spm"
KINDS = list(BPE_KINDS) + [SPM_KIND]

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")


# ---------------------------------------------------------------------------------------------------------------
# Training


def _bpe_pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    if pre == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # SmolLM's tokenizer.json: every digit on its own, then GPT-2 byte level
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    pattern = {"llama-bpe": LLAMA3_PATTERN, "qwen2": QWEN2_PATTERN, "gpt-4o": GPT4O_PATTERN}[pre]
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def numbered_lines(text: str) -> str:
    """The text with a number before every line: Shakespeare has almost no digits, this teaches digit merges."""
    return "".join(f"{(i * 7919) % 100000} {line}\n" for i, line in enumerate(text.split("\n")))


def train_bpe(pre: str, train_pre: str, files: list[str]):
    """A byte-level BPE with vocabulary and merges trained under pre-tokenizer `train_pre`, encoding with `pre`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(ignore_merges=(pre == "llama-bpe")))
    tok.pre_tokenizer = _bpe_pre_tokenizer(train_pre)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, special_tokens=BPE_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(files, trainer)
    tok.pre_tokenizer = _bpe_pre_tokenizer(pre)
    return tok


def bpe_data(tok, pre: str) -> dict:
    """The TokenizerData fields of a trained HF byte-level BPE tokenizer."""
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [""] * len(vocab)
    for piece, i in vocab.items():
        tokens[i] = piece
    types = [NORMAL] * len(tokens)
    for added in tok.get_added_tokens_decoder().values():
        types[tok.token_to_id(added.content)] = CONTROL if added.special else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    eot = tok.token_to_id("<|endoftext|>")
    return {"model": "gpt2", "pre": pre, "tokens": tokens, "scores": [], "token_types": types, "merges": merges,
            "bos": eot, "eos": eot, "unk": -1, "pad": -1, "add_bos": False, "add_eos": False,
            "add_space_prefix": False, "chat_template": CHATML_TEMPLATE}


def train_spm(text_path: Path):
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "spm")
        spm.SentencePieceTrainer.train(
            input=str(text_path), model_prefix=prefix, model_type="bpe", vocab_size=SPM_VOCAB, byte_fallback=True,
            character_coverage=1.0, normalization_rule_name="identity", remove_extra_whitespaces=False,
            add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, seed_sentencepiece_size=1000000,
            input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2)
        return spm.SentencePieceProcessor(model_file=prefix + ".model")


def spm_data(sp) -> dict:
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i):
            types.append(CONTROL)
        elif sp.is_byte(i):
            types.append(BYTE)
        elif sp.is_unused(i):
            types.append(UNUSED)
        else:
            types.append(NORMAL)
    return {"model": "llama", "pre": "default", "tokens": tokens, "scores": scores, "token_types": types,
            "merges": [], "bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id(), "pad": sp.pad_id(),
            "add_bos": True, "add_eos": False, "add_space_prefix": True, "chat_template": LLAMA2_TEMPLATE}


# ---------------------------------------------------------------------------------------------------------------
# Test strings


def make_strings(text: str, seed: int = SEED) -> list[str]:
    rng = random.Random(seed)
    lines = [ln for ln in text.split("\n") if ln.strip()]
    out: list[str] = ["", " ", "  ", "\n", "\t", "a", "A", "hello", " hello", "hello ", "  hello  world  "]

    # Shakespeare: single lines, multi-line chunks (with their newlines), one long passage.
    for _ in range(300):
        out.append(rng.choice(lines))
    for _ in range(80):
        start = rng.randrange(len(text) - 400)
        out.append(text[start:start + rng.randint(20, 400)])
    out.append(text[10000:16000])

    words = {
        "accents": ["café", "naïve", "résumé", "Ångström", "façade", "jalapeño", "Müller", "straße", "ÉCOLE",
                    "crème brûlée", "São Paulo", "Dvořák", "Łódź", "e\u0301", "n\u0303o"],
        "greek": ["Καλημέρα", "κόσμε", "αβγδε", "ΑΘΗΝΑ", "ψυχή", "λόγος"],
        "cyrillic": ["Привет", "мир", "Москва", "ЁЖИК", "съешь", "Україна", "їжак"],
        "cjk": ["你好", "世界", "日本語", "のテキスト", "한국어", "東京タワー", "漢字", "カタカナ", "中文，标点。"],
        "arabic": ["مرحبا", "بالعالم", "العربية", "שלום", "עולם", "नमस्ते", "हिन्दी", "ภาษาไทย"],
        "emoji": ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "🤷🏻‍♂️", "👩🏿‍💻", "🧑‍🤝‍🧑", "✨", "🎉🎉",
                  "☃", "♥", "⚡️"],
        "contractions": ["I'm", "don't", "it's", "we're", "they'll", "you've", "he'd", "THEY'RE", "I'VE", "Can'T",
                         "'s", "'t", "'re", "'ll", "o'er", "'tis", "ne'er"],
        "punct": ["!!!", "...", "?!", "--", "—", "–", "``", "\"'", "()", "[]{}", "<>", "@#$%^&*", ";;", "…",
                  "«»", "„“", "¿¡", "://", "=>", "!=", "&&", "||", "_", "__init__"],
        "digits": ["1", "12", "123", "1234", "12345", "1234567", "3.14159", "1,000,000", "2024-01-31", "0x1F",
                   "٣٤٥", "१२३", "①②", "½", "Ⅻ", "10e-5", "+49 30 1234567"],
    }
    ws_pool = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", " \t ", "\t\t", "\u00a0", "\u3000",
               "\u2003", "\u0085", "\u2028", "\x0b", "\x0c", "    ", "\n\n\n"]
    specials = BPE_SPECIALS + ["<s>", "</s>", "<unk>"]

    def word() -> str:
        cat = rng.choice(list(words))
        return rng.choice(words[cat])

    # Each category alone and in phrases.
    for cat, ws in words.items():
        for w in ws:
            out.append(w)
            out.append(" " + w)
        for _ in range(20):
            out.append(" ".join(rng.choice(ws) for _ in range(rng.randint(2, 6))))
    # Mixed phrases with random whitespace.
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(1, 8)):
            parts.append(word() if rng.random() < 0.8 else rng.choice(lines).split(" ")[0])
            parts.append(rng.choice(ws_pool) if rng.random() < 0.4 else " ")
        s = "".join(parts)
        if rng.random() < 0.3:
            s = rng.choice(ws_pool) + s
        if rng.random() < 0.5:
            s = s.rstrip(" ")
        out.append(s)
    # Whitespace runs alone, leading and trailing.
    for _ in range(60):
        out.append("".join(rng.choice(ws_pool) for _ in range(rng.randint(1, 5))))
        out.append(rng.choice(ws_pool) + "word" + rng.choice(ws_pool) + "other" + rng.choice(ws_pool))
    # Digit runs.
    for n in range(1, 16):
        out.append("".join(str((i * 7 + 3) % 10) for i in range(n)))
        out.append("x" + "9" * n + " " + "1" * n + "a")
    for _ in range(20):
        out.append(f"{rng.randint(0, 10**rng.randint(1, 12))} apples and {rng.random() * 1000:.3f} pears")
    # Contractions in context.
    for _ in range(40):
        a, b = rng.choice(words["contractions"]), rng.choice(words["contractions"])
        out.append(f"{a} {rng.choice(lines).split(' ')[-1]} {b}")
    # Punctuation runs.
    for _ in range(40):
        out.append("".join(rng.choice(words["punct"]) for _ in range(rng.randint(1, 6))))
        out.append("word" + rng.choice(words["punct"]) + rng.choice(ws_pool) + rng.choice(words["punct"]) + "x")
    # Special tokens embedded in text.
    out += ["<|endoftext|>", "<|im_start|>user\nHello<|im_end|>\n", "<s>", "</s>", "<unk>", "a<|im_end|>b",
            "<|im_start|><|im_end|>", " <|endoftext|> ", "<|im_start", "|im_end|>", "<<|im_start|>>"]
    for _ in range(60):
        parts = []
        for _ in range(rng.randint(1, 5)):
            parts.append(rng.choice(specials) if rng.random() < 0.4 else rng.choice([word(), rng.choice(lines)]))
            if rng.random() < 0.5:
                parts.append(rng.choice(ws_pool))
        out.append("".join(parts))
    # Random valid UTF-8 mixtures from well-established Unicode blocks.
    ranges = [(0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x17F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
              (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x2000, 0x206F), (0x2100, 0x218F),
              (0x2190, 0x21FF), (0x2460, 0x24FF), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00),
              (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x10000, 0x1007F), (0x1D400, 0x1D4FF)]
    for _ in range(150):
        n = rng.randint(1, 40)
        chars = []
        for _ in range(n):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
        out.append("".join(chars))

    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


# ---------------------------------------------------------------------------------------------------------------
# GGUF metadata from a committed fixture


def load_fixture(kind: str) -> dict:
    with open(FIXTURES / f"{kind}.json", encoding="utf-8") as f:
        return json.load(f)


def tokenizer_metadata(kind: str) -> dict:
    """The tokenizer.ggml.* (and tokenizer.chat_template) GGUF keys of fixture `kind` (one of KINDS).

    Values are plain Python lists / ints / bools / strs; the caller picks the GGUF value types
    (tokens: string array, scores: f32 array, token_type: i32 array, merges: string array, ids: u32)."""
    d = load_fixture(kind)
    md = {
        "tokenizer.ggml.model": d["model"],
        "tokenizer.ggml.pre": d["pre"],
        "tokenizer.ggml.tokens": d["tokens"],
        "tokenizer.ggml.token_type": d["token_types"],
        "tokenizer.ggml.add_bos_token": d["add_bos"],
        "tokenizer.ggml.add_eos_token": d["add_eos"],
        "tokenizer.chat_template": d["chat_template"],
    }
    if d["scores"]:
        md["tokenizer.ggml.scores"] = d["scores"]
    if d["merges"]:
        md["tokenizer.ggml.merges"] = d["merges"]
    if d["model"] == "llama":
        md["tokenizer.ggml.add_space_prefix"] = d["add_space_prefix"]
    for key, field in [("bos_token_id", "bos"), ("eos_token_id", "eos"), ("unknown_token_id", "unk"),
                       ("padding_token_id", "pad")]:
        if d[field] >= 0:
            md[f"tokenizer.ggml.{key}"] = d[field]
    return md


# ---------------------------------------------------------------------------------------------------------------


def _write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("text", nargs="?", default=None, help="training text (default: tiny Shakespeare)")
    ap.add_argument("--out", default=str(FIXTURES), help="fixture folder")
    ap.add_argument("--only", nargs="*", choices=KINDS, help="write these fixtures alone (strings.json kept)")
    args = ap.parse_args()
    text_path = Path(args.text) if args.text else (DEFAULT_TEXT if DEFAULT_TEXT.exists() else FALLBACK_TEXT)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = text_path.read_text(encoding="utf-8")

    strings = make_strings(text)
    if args.only:
        with open(out / "strings.json", encoding="utf-8") as f:
            assert json.load(f) == strings, "strings.json differs from the strings this text gives"
    else:
        _write_json(out / "strings.json", strings)
    wanted = set(args.only or KINDS)

    with tempfile.TemporaryDirectory() as tmp:
        numbered = Path(tmp) / "numbered.txt"
        numbered.write_text(numbered_lines(text), encoding="utf-8")
        tokenizers = {name: train_bpe(pre, train_pre, [str(text_path), str(numbered)])
                      for name, (pre, train_pre) in BPE_KINDS.items() if name in wanted}
    for name, tok in tokenizers.items():
        pre = BPE_KINDS[name][0]
        _write_json(out / f"{name}.json", bpe_data(tok, pre))
        with_special = [tok.encode(s, add_special_tokens=False).ids for s in strings]
        tok.encode_special_tokens = True
        no_special = [tok.encode(s, add_special_tokens=False).ids for s in strings]
        _write_json(out / f"{name}.ref.json", {"ids": with_special, "ids_no_special": no_special})
        print(f"{name}: vocab {tok.get_vocab_size()}, {len(strings)} strings")

    if SPM_KIND not in wanted:
        return
    sp = train_spm(text_path)
    _write_json(out / f"{SPM_KIND}.json", spm_data(sp))
    ids = [sp.encode(s) for s in strings]
    _write_json(out / f"{SPM_KIND}.ref.json", {"ids": ids, "ids_no_special": ids})
    print(f"{SPM_KIND}: vocab {sp.get_piece_size()}, {len(strings)} strings")


if __name__ == "__main__":
    main()
