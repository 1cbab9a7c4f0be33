#!/usr/bin/env python3
"""Adds llama.cpp's logits (llama-cpp-python, the Q4_1 file as is) to smollm2-goldens.json: a
second, independent reference for the SmolLM2 cases, whose tokens it reuses.

llama.cpp runs the file's own quantized kernels (on CPU it also quantizes the activations to
Q8 for the Q4_1 matmuls), so it differs from the float32 mlx_lm reference by more than float
rounding: compare with a tolerance of the order of 0.1-0.3 logit, not 1e-4.

Run in any venv with llama-cpp-python and numpy (no mlx needed), after make_smollm2_goldens.py:
    python accelerator/tests/data/causal/add_llama_cpp_logits.py
The GGUF path: $HUNCH_SMOLLM2_GGUF or ~/.cache/hunch/models/SmolLM2-135M-Instruct.Q4_1.gguf.
"""

import json
import os
from pathlib import Path

import numpy as np
import llama_cpp
from llama_cpp import Llama

HERE = Path(__file__).resolve().parent


def main():
    p = os.environ.get("HUNCH_SMOLLM2_GGUF")
    path = Path(p) if p else Path.home() / ".cache/hunch/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    out_path = HERE / "smollm2-goldens.json"
    g = json.loads(out_path.read_text())
    llm = Llama(model_path=str(path), n_ctx=2048, n_threads=1, n_batch=512, logits_all=True,
                verbose=False, seed=0)
    for c in g["cases"]:
        # the file's tokenizer must give the same ids as the reference's
        ids = llm.tokenize(c["text"].encode(), add_bos=False, special=True)
        assert ids == c["tokens"], "llama.cpp tokenizes the rendered text differently"
        llm.reset()
        llm.eval(c["tokens"])
        logits = np.array(llm.scores[len(c["tokens"]) - 1], dtype=np.float64)
        c["llama_cpp_label_logits"] = [float(logits[i]) for i in c["label_ids"]]
        c["llama_cpp_argmax"] = int(np.argmax(logits))
        c["llama_cpp_logsumexp"] = float(np.logaddexp.reduce(logits))
        d = max(abs(a - b) for a, b in zip(c["llama_cpp_label_logits"], c["label_logits"]))
        print(len(c["tokens"]), "tokens: max |llama.cpp - mlx_lm| at the labels", round(d, 4),
              "argmax", c["llama_cpp_argmax"], c["argmax"])
    g["llama_cpp"] = (f"llama-cpp-python {llama_cpp.__version__}: {path.name} as is, CPU, "
                      "n_threads 1, n_batch 512, logits of the last position")
    out_path.write_text(json.dumps(g, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
