#!/usr/bin/env python3
"""Writes testdata/<family>/expected.json: Hugging Face `tokenizers`' ids and decodings of every
corpus.json text, for tokenizer_test to compare against.

    pip install tokenizers==<version in expected.json>   # PyPI
    python3 tokenizer/testdata/make_expected.py [FAMILY ...]
"""
import json
import os
import sys

import tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))


def main(families):
    corpus = json.load(open(os.path.join(HERE, "corpus.json"), encoding="utf-8"))
    if not families:
        families = sorted(d for d in os.listdir(HERE)
                          if os.path.isfile(os.path.join(HERE, d, "tokenizer.json")))
    for family in families:
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
        out = {"tokenizers_version": tokenizers.__version__, "cases": cases}
        with open(os.path.join(HERE, family, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=0)
        print(family, len(cases), "cases")


if __name__ == "__main__":
    main(sys.argv[1:])
