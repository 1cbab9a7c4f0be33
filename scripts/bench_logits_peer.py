#!/usr/bin/env python3
"""The llama.cpp side of `logits-bench` (docs/benchmarks.md, "Chat models against llama.cpp").

Reads the scoring sequences Hunch planned (token ids, label ids, grouped by request) from a JSON
file, evaluates each with llama-cpp-python on the same GGUF and thread count, reusing the KV cache
of the longest common token prefix with the previous sequence (as llama.cpp's own prompt cache
does, and as Hunch reuses whole chunks), and prints one JSON object: per-sequence seconds, the
tokens evaluated, and the label logits (so the two runs can be checked to read the same thing).

    python scripts/bench_logits_peer.py SEQUENCES.json MODEL.gguf THREADS ROUNDS
"""

import json
import sys
import time

import numpy as np
from llama_cpp import Llama


def drop_after(llm, keep):
    """Forget the KV cache past `keep` tokens (the API's name moved between releases)."""
    ctx = llm._ctx
    for name in ("memory_seq_rm", "kv_cache_seq_rm"):
        fn = getattr(ctx, name, None)
        if fn is not None:
            fn(-1, keep, -1)
            break
    else:
        raise RuntimeError("this llama-cpp-python has no way to trim the KV cache")
    llm.n_tokens = keep


def main():
    sequences_path, model, threads, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    plan = json.load(open(sequences_path))
    longest = max(len(s["tokens"]) for r in plan["requests"] for s in r)
    llm = Llama(
        model_path=model,
        n_ctx=max(2048, longest + 16),
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        logits_all=False,
        verbose=False,
    )
    out = {"rounds": [], "llama_cpp_version": getattr(sys.modules["llama_cpp"], "__version__", "?")}
    for _ in range(rounds):
        drop_after(llm, 0)
        previous = []
        rows = []
        for request in plan["requests"]:
            for seq in request:
                tokens = seq["tokens"]
                common = 0
                for a, b in zip(previous, tokens):
                    if a != b:
                        break
                    common += 1
                # At least the last token is evaluated: its logits are the read.
                common = min(common, len(tokens) - 1)
                start = time.perf_counter()
                drop_after(llm, common)
                llm.eval(tokens[common:])
                logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
                seconds = time.perf_counter() - start
                rows.append(
                    {
                        "seconds": seconds,
                        "evaluated": len(tokens) - common,
                        "label_logits": [float(logits[i]) for i in seq["labels"]],
                    }
                )
                previous = tokens
        out["rounds"].append(rows)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
