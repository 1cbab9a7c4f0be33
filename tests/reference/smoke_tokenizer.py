#!/usr/bin/env python3
"""Throwaway tokenizer for a smoke run of reference_read.py on a tiny HF checkpoint without a tokenizer (which has
none). NOT the project's tiny tokenizer (the e2e tests generate theirs in Rust): only enough to
exercise the harness end to end.

    smoke_tokenizer.py OUT_DIR      writes OUT_DIR/tokenizer.json

A BPE over printable ASCII with SentencePiece-style "▁" spaces, vocab < 512: specials <pad> 0,
<eos> 1, <bos> 2, <|channel> 100, <channel|> 101, <|turn> 105, <turn|> 106, "\\n" 107; every
"▁" + letter/digit, "▁yes" and "▁no" are single tokens (so "q1: A", "q1: yes", "q1: 3" put the label
in one token)."""
import json
import os
import string
import sys

FIXED = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<|channel>": 100, "<channel|>": 101,
         "<|turn>": 105, "<turn|>": 106, "\n": 107}
SPECIAL = [t for t in FIXED if t != "\n"]


def build():
    chars = [c for c in string.printable if c not in " \t\n\r\x0b\x0c"] + ["▁"]
    merges = [("▁", c) for c in string.ascii_letters + string.digits]
    merges += [("e", "s"), ("▁y", "es"), ("▁n", "o")]
    tokens = chars + [a + b for a, b in merges]
    vocab, free = dict(FIXED), (i for i in range(512) if i not in FIXED.values())
    for t in tokens:
        vocab[t] = next(free)
    added = [{"id": FIXED[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": t in SPECIAL} for t in FIXED]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": "▁"}, "behavior": "MergedWithNext",
                          "invert": False},
        "post_processor": None,
        "decoder": {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(build(), f, ensure_ascii=False)
