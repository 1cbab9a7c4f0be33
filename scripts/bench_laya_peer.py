#!/usr/bin/env python3
"""The peer side of `laya-bench`: llama.cpp's encoder over the very token sequences Hunch's laya
read ran, on the encoder-only copy of the same file (scripts/bench_laya_gguf.py writes both).

Reads the sequences (token ids, grouped by request) from a JSON file, loads ENCODER.gguf with
llama-cpp-python (`embedding=True`, `pooling_type` NONE: the per-token states, which llama-server's
laya read takes at the option markers), and times one `llama_decode` of each whole sequence with
every position an output, ROUNDS times (the caller counts the first as a warm-up). The laya head
is not run: llama.cpp 0.3.36 has none (llama-server's laya read is a later release's), so its
cost, which Hunch's times include, is not llama.cpp's to pay here. An encoder keeps nothing
between sequences (every position sees every other), so there is no cache to reuse or reset.

Prints one JSON object: per round, per sequence, the seconds and the tokens; the runtime's version
and system info (the ISA it was built for), the thread count and this process's peak resident set.

    python scripts/bench_laya_peer.py SEQUENCES.json ENCODER.gguf THREADS ROUNDS
"""

import json
import sys
import time

import numpy as np


def peak_rss_bytes():
    """`VmHWM` of this process (the model, llama.cpp's buffers and Python), where Linux has it."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main():
    if len(sys.argv) != 5:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    sequences_path, model, threads, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    import llama_cpp
    from llama_cpp import LLAMA_POOLING_TYPE_NONE, Llama

    plan = json.load(open(sequences_path))
    sequences = [s["tokens"] for request in plan["requests"] for s in request]
    longest = max(len(s) for s in sequences)
    # An encoder reads a sequence in one ubatch: context, batch and ubatch all hold the longest.
    n = -(-longest // 256) * 256
    llm = Llama(model_path=model, n_ctx=n, n_batch=n, n_ubatch=n, n_threads=threads,
                n_threads_batch=threads, embedding=True, pooling_type=LLAMA_POOLING_TYPE_NONE,
                verbose=False)
    width = llama_cpp.llama_model_n_embd(llm.model)
    ctx = llm._ctx.ctx

    out = []
    for _ in range(rounds):
        rows = []
        for tokens in sequences:
            llm._batch.set_batch(tokens, 0, True)  # every position an output
            start = time.perf_counter()
            llm._ctx.decode(llm._batch)
            llama_cpp.llama_synchronize(ctx)
            seconds = time.perf_counter() - start
            last = np.ctypeslib.as_array(llm._ctx.get_embeddings_ith(len(tokens) - 1), shape=(width,))
            if not np.isfinite(last).all():
                raise SystemExit(f"llama.cpp's state of a {len(tokens)}-token sequence is not finite")
            rows.append({"seconds": seconds, "tokens": len(tokens)})
        out.append(rows)
    info = llama_cpp.llama_print_system_info()
    print(json.dumps({
        "rounds": out,
        "runtime": "llama.cpp",
        "version": getattr(llama_cpp, "__version__", "?"),
        "system_info": info.decode() if isinstance(info, bytes) else str(info),
        "threads": threads,
        "n_ctx": n,
        "peak_rss_bytes": peak_rss_bytes(),
    }))


if __name__ == "__main__":
    main()
