#!/usr/bin/env python3
"""Writes testdata/<family>/expected.json: Hugging Face `tokenizers`' (tokenizer.json) or
SentencePiece's (tokenizer.model) ids and decodings of every corpus.json text, and decodings of
pseudo-random id sequences ("decode_cases": byte tokens that make valid, truncated and invalid
UTF-8, special tokens, space-only tokens; seeded by the family name), for tokenizer_test to
compare against.

    pip install tokenizers sentencepiece   # PyPI; versions: expected.json's "reference"
    python3 tokenizer/testdata/make_expected.py [FAMILY ...]
"""
import json
import os
import random
import re
import sys

import tokenizers

try:
    import sentencepiece
except ImportError:  # only the SentencePiece families need it
    sentencepiece = None

HERE = os.path.dirname(os.path.abspath(__file__))


def main(families):
    corpus = json.load(open(os.path.join(HERE, "corpus.json"), encoding="utf-8"))
    if not families:
        families = sorted(d for d in os.listdir(HERE)
                          if os.path.isfile(os.path.join(HERE, d, "tokenizer.json"))
                          or os.path.isfile(os.path.join(HERE, d, "tokenizer.model")))
    for family in families:
        model = os.path.join(HERE, family, "tokenizer.model")
        if os.path.isfile(model):
            cases, decode_cases = spm_cases(model, corpus, family)
            write(family, cases, decode_cases, "sentencepiece " + sentencepiece.__version__)
            continue
        tok = tokenizers.Tokenizer.from_file(os.path.join(HERE, family, "tokenizer.json"))
        decode_cases = []
        for ids in random_ids(family, hf_token_kinds(tok)):
            decode_cases.append({
                "ids": ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            })
        cases = []
        for text in corpus:
            with_special = tok.encode(text, add_special_tokens=True).ids
            without = tok.encode(text, add_special_tokens=False).ids
            cases.append({
                "text": text,
                "ids": without,
                "ids_with_special": with_special,
                "decoded": tok.decode(with_special, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(with_special, skip_special_tokens=True),
            })
        write(family, cases, decode_cases, "tokenizers " + tokenizers.__version__)


def hf_token_kinds(tok):
    """Ids of byte tokens (<0xXX>, or one byte-level character), special (added) tokens, and
    space-only tokens, keyed by byte value where there is one."""
    vocab = tok.get_vocab(with_added_tokens=False)
    byte_ids = {}
    for token, i in vocab.items():
        m = re.fullmatch(r"<0x([0-9A-F]{2})>", token)
        if m:
            byte_ids[int(m.group(1), 16)] = i
    if not byte_ids:  # byte-level: the 256 one-character tokens, in GPT-2's alphabet order
        alphabet = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
        chars = {b: chr(b) for b in alphabet}
        n = 0
        for b in range(256):
            if b not in chars:
                chars[b] = chr(256 + n)
                n += 1
        byte_ids = {b: vocab[c] for b, c in chars.items() if c in vocab}
    special = sorted(tok.get_added_tokens_decoder())
    spaces = sorted(i for t, i in vocab.items() if t and set(t) <= {"\u2581", "\u0120"})
    return byte_ids, special, spaces, tok.get_vocab_size()


def random_ids(family, kinds):
    """40 sequences: byte tokens of a real character (sometimes cut short), stray bytes,
    special and space-only tokens, and any id."""
    byte_ids, special, spaces, vocab_size = kinds
    rng = random.Random(family)
    out = []
    for _ in range(40):
        ids, length = [], rng.randint(1, 16)
        while len(ids) < length:
            r = rng.random()
            if r < 0.25:
                raw = rng.choice(["é", "世", "😀", "\u2581", "A", " "]).encode()
                if rng.random() < 0.3:
                    raw = raw[:-1] or raw
                ids += [byte_ids[b] for b in raw if b in byte_ids]
            elif r < 0.4:
                ids.append(byte_ids[rng.choice(sorted(byte_ids))])
            elif r < 0.5 and special:
                ids.append(rng.choice(special))
            elif r < 0.6 and spaces:
                ids.append(rng.choice(spaces))
            else:
                ids.append(rng.randrange(vocab_size))
        out.append(ids)
    return out


def spm_cases(path, corpus, family):
    """SentencePiece's own ids and decoding; BOS first with special tokens (as HF's Llama /
    Mistral tokenizers add it). sentencepiece drops control pieces when decoding, so only the
    skip-special decoding is recorded."""
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    byte_ids = {int(sp.id_to_piece(i)[3:5], 16): i for i in range(sp.get_piece_size()) if sp.is_byte(i)}
    special = [i for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)]
    spaces = [i for i in range(sp.get_piece_size())
              if not sp.is_byte(i) and set(sp.id_to_piece(i)) == {"\u2581"}]
    decode_cases = [{"ids": ids, "decoded_skip_special": sp.decode(ids)}
                    for ids in random_ids(family, (byte_ids, special, spaces, sp.get_piece_size()))]
    cases = []
    for text in corpus:
        ids = sp.encode(text)
        cases.append({
            "text": text,
            "ids": ids,
            "ids_with_special": [sp.bos_id()] + ids,
            "decoded_skip_special": sp.decode(ids),
        })
    return cases, decode_cases


def write(family, cases, decode_cases, reference):
    out = {"reference": reference, "cases": cases, "decode_cases": decode_cases}
    with open(os.path.join(HERE, family, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
    print(family, len(cases), "cases", reference)


if __name__ == "__main__":
    main(sys.argv[1:])
