#!/usr/bin/env python3
"""Writes testdata/<family>/expected.json: Hugging Face `tokenizers`' (tokenizer.json) or
SentencePiece's (tokenizer.model) ids and decodings of every corpus.json text, for
tokenizer_test to compare against.

    pip install tokenizers sentencepiece   # PyPI; versions: expected.json's "reference"
    python3 tokenizer/testdata/make_expected.py [FAMILY ...]
"""
import json
import os
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
            write(family, spm_cases(model, corpus), "sentencepiece " + sentencepiece.__version__)
            continue
        tok = tokenizers.Tokenizer.from_file(os.path.join(HERE, family, "tokenizer.json"))
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
        write(family, cases, "tokenizers " + tokenizers.__version__)


def spm_cases(path, corpus):
    """SentencePiece's own ids and decoding; BOS first with special tokens (as HF's Llama /
    Mistral tokenizers add it). sentencepiece drops control pieces when decoding, so only the
    skip-special decoding is recorded."""
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    cases = []
    for text in corpus:
        ids = sp.encode(text)
        cases.append({
            "text": text,
            "ids": ids,
            "ids_with_special": [sp.bos_id()] + ids,
            "decoded_skip_special": sp.decode(ids),
        })
    return cases


def write(family, cases, reference):
    out = {"reference": reference, "cases": cases}
    with open(os.path.join(HERE, family, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
    print(family, len(cases), "cases", reference)


if __name__ == "__main__":
    main(sys.argv[1:])
