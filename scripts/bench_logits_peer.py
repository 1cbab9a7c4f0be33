#!/usr/bin/env python3
"""The peer side of `logits-bench` (docs/benchmarks.md, "Label-logit read against llama.cpp").

Reads the scoring sequences Hunch planned (token ids, label ids, grouped by request) from a JSON
file, evaluates each with another runtime on the same checkpoint, reusing the KV cache of the
longest common token prefix with the previous sequence (as llama.cpp's own prompt cache does, and
as Hunch reuses whole chunks), and prints one JSON object: per-sequence seconds, the tokens
evaluated, and the label logits (so the runs can be checked to read the same thing).

- a `.gguf` file: llama.cpp through llama-cpp-python, on THREADS threads;
- a Hugging Face folder: mlx-lm on MLX (the Python package's CPU wheel, its own BLAS), prefilling
  as mlx-lm's `generate` does (the cache's states evaluated, the head only at the last token).

    python scripts/bench_logits_peer.py SEQUENCES.json MODEL THREADS ROUNDS
"""

import json
import sys
import time

import numpy as np


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


def common_prefix(previous, tokens):
    """Tokens shared with the previous sequence, leaving at least the last one to evaluate (its
    logits are the read)."""
    common = 0
    for a, b in zip(previous, tokens):
        if a != b:
            break
        common += 1
    return min(common, len(tokens) - 1)


def measure(plan, rounds, reset, evaluate):
    """Every round: `reset()` empties the runtime's cache, then each sequence is timed through
    `evaluate(tokens, common)`, which keeps the first `common` tokens' K/V, evaluates the rest and
    returns the last position's logits (an indexable of floats)."""
    out = []
    for _ in range(rounds):
        reset()
        previous = []
        rows = []
        for request in plan["requests"]:
            for seq in request:
                tokens = seq["tokens"]
                common = common_prefix(previous, tokens)
                start = time.perf_counter()
                logits = evaluate(tokens, common)
                seconds = time.perf_counter() - start
                rows.append({"seconds": seconds, "evaluated": len(tokens) - common,
                             "label_logits": [float(logits[i]) for i in seq["labels"]]})
                previous = tokens
        out.append(rows)
    return out


def mlx_lm_runtime(model):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    lm, _ = load(model)
    state = {"cache": None, "cached": 0}

    def reset():
        state["cache"] = make_prompt_cache(lm)
        state["cached"] = 0

    def evaluate(tokens, common):
        cache = state["cache"]
        trim_prompt_cache(cache, state["cached"] - common)
        rest = tokens[common:]
        for at in range(0, len(rest) - 1, 2048):
            lm(mx.array(rest[at:min(at + 2048, len(rest) - 1)])[None], cache=cache)
            mx.eval([c.state for c in cache])
        logits = lm(mx.array(rest[-1:])[None], cache=cache)[0, -1].astype(mx.float32)
        mx.eval(logits)
        state["cached"] = len(tokens)
        return np.array(logits)

    return "mlx-lm", mx.__version__, reset, evaluate


def llama_cpp_runtime(plan, model, threads):
    from llama_cpp import Llama

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

    def evaluate(tokens, common):
        drop_after(llm, common)
        llm.eval(tokens[common:])
        # Without logits_all only the batch's last token has logits, and only in the context
        # (llama-cpp-python no longer copies them into `scores`).
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    version = getattr(sys.modules["llama_cpp"], "__version__", "?")
    return "llama.cpp", version, lambda: drop_after(llm, 0), evaluate


def main():
    sequences_path, model, threads, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    plan = json.load(open(sequences_path))
    if model.endswith(".gguf"):
        runtime, version, reset, evaluate = llama_cpp_runtime(plan, model, threads)
    else:
        runtime, version, reset, evaluate = mlx_lm_runtime(model)
    rounds_out = measure(plan, rounds, reset, evaluate)
    print(json.dumps({"rounds": rounds_out, "runtime": runtime, "version": version}))


if __name__ == "__main__":
    main()
