#!/usr/bin/env python3
"""Writes the Metaspace / SentencePiece-style BPE tokenizer.json fixtures listed in
converted.txt: the Mistral tokenizer.model fixtures converted by transformers'
convert_slow_tokenizer (LlamaConverter), wrapped as LlamaTokenizerFast does (added special
tokens, the BOS TemplateProcessing), which is how Llama-2's and Mistral's tokenizer.json files
were made. No PyPI package ships an upstream file of this family, so the real converter makes
them. Run by convert_fixtures.sh (pinned versions, in a cached venv):

    python3 convert_fixtures.py TESTDATA_DIR FAMILY...
"""
import os
import sys
import warnings

from tokenizers import decoders, pre_tokenizers
from transformers import LlamaTokenizer, LlamaTokenizerFast
from transformers.convert_slow_tokenizer import convert_slow_tokenizer

# family -> (source .model family, LlamaTokenizer options, what is changed after conversion)
VARIANTS = {
    # Llama-2 / Mistral-7B-v0.1: Prepend + Replace normalizers, no pre-tokenizer,
    # Replace / ByteFallback / Fuse / Strip decoder.
    "metaspace_legacy": ("mistral_v1", {"legacy": True}, None),
    # Current Llama / Mistral files: Metaspace(prepend_scheme="first", split=false).
    "metaspace_first": ("mistral_v3", {"legacy": False}, None),
    # add_prefix_space=False: Metaspace(prepend_scheme="never"), no Strip in the decoder.
    "metaspace_never": ("mistral_v3", {"legacy": False, "add_prefix_space": False}, None),
    # Metaspace with "always" and split=true, and the Metaspace decoder (tokenizers' own
    # classes; T5-style files use them).
    "metaspace_always_split": ("mistral_v1", {"legacy": False}, "always_split"),
}


def convert(model_path, options, change):
    slow = LlamaTokenizer(vocab_file=model_path, **options)
    fast = LlamaTokenizerFast(tokenizer_object=convert_slow_tokenizer(slow),
                              bos_token=slow.bos_token, eos_token=slow.eos_token,
                              unk_token=slow.unk_token, **options)
    tok = fast.backend_tokenizer
    if change == "always_split":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                     split=True)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    return tok


def main(testdata, families):
    warnings.simplefilter("ignore")
    for family in families:
        source, options, change = VARIANTS[family]
        tok = convert(os.path.join(testdata, source, "tokenizer.model"), options, change)
        os.makedirs(os.path.join(testdata, family), exist_ok=True)
        tok.save(os.path.join(testdata, family, "tokenizer.json"))
        print("convert_fixtures:", family, "<-", source, options, change or "")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
