#!/usr/bin/env python3
"""Reference logits of the real default model, SmolLM2-135M-Instruct (Q4_1 GGUF), for three
ChatML prompts ending in the `{"answer": "` prefill -> smollm2-goldens.json.

The GGUF itself is not committed: its path is $HUNCH_SMOLLM2_GGUF, default
~/.cache/hunch/models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-default-model.sh fetches it).

Reference: every tensor of the file dequantised to float32 by gguf-py (Q4_1 blocks, the Q8_0
token_embd, F32 norms), llama.cpp's q/k row permutation undone, embeddings tied (the file has no
`output`), as a float32 Hugging Face llama model run through mlx_lm 0.32.2 (CPU). The config comes
from the file's llama.* metadata.

Tokens: a `tokenizers` byte-level BPE built from the file's tokenizer.ggml.tokens/merges with
SmolLM2's pre-tokenizer (Digits(individual_digits) then ByteLevel, as its tokenizer.json and
llama.cpp's "smollm" pre-tokenizer have it), control tokens as special added tokens; the text is
the file's tokenizer.chat_template rendered by transformers' apply_chat_template
(add_generation_prompt=True) plus the prefill; encoded without adding special tokens (the file
says add_bos_token false). Each label must be one token at the boundary:
encode(text + label) == encode(text) + [id].

A second, independent reference, llama.cpp's logits for the same tokens
(`llama_cpp_label_logits`, `llama_cpp_argmax`, `llama_cpp_logsumexp`), is added afterwards by
add_llama_cpp_logits.py, run in a venv that has llama-cpp-python.

Run:  .venv-chatref/bin/python accelerator/tests/data/causal/make_smollm2_goldens.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

import gguf
import mlx.core as mx
import mlx_lm

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_goldens import case, gguf_version, llama_unpermute, model_from_weights, last_logits  # noqa: E402

LABELS = ["A", "B", "C", "D", "E", "F"]

SYSTEM = (
    "You answer questions about a state. Treat the state as data. Reply with JSON: "
    '{"answer": "<label>"}.'
)
PROMPTS = [
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": 'State:\n{"door":"open","light":"off"}\n\n'
                                    "Question: Is the door open?\nA = yes\nB = no"},
    ],
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": 'State:\n{"sky":"grey","temperature_c":4,"wind_kmh":35}\n\n'
                                    "Question: What should I wear?\nA = a t-shirt\nB = a coat\n"
                                    "C = a swimsuit\nD = nothing special"},
    ],
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": 'State:\n"The invoice total is 120 EUR; the customer paid 100 '
                                    'EUR on 2024-06-01 and 20 EUR on 2024-06-15."\n\n'
                                    "Question: Is the invoice fully paid?\nA = yes\nB = no\n"
                                    "C = cannot tell"},
    ],
]
PREFILL = '{"answer": "'


def gguf_path() -> Path:
    p = os.environ.get("HUNCH_SMOLLM2_GGUF")
    return Path(p) if p else Path.home() / ".cache/hunch/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def sha256(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def field(r, key):
    return r.fields[key].contents()


def build_tokenizer(r):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    assert field(r, "tokenizer.ggml.model") == "gpt2" and field(r, "tokenizer.ggml.pre") == "smollm"
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ")) for m in field(r, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    control = [tokens[i] for i, t in enumerate(types) if t == int(gguf.TokenType.CONTROL)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    eos = tokens[field(r, "tokenizer.ggml.eos_token_id")]
    bos = tokens[field(r, "tokenizer.ggml.bos_token_id")]
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                 chat_template=field(r, "tokenizer.chat_template"))
    return hf, control


def dequantised_llama(r):
    cfg = {
        "model_type": "llama",
        "hidden_size": int(field(r, "llama.embedding_length")),
        "num_hidden_layers": int(field(r, "llama.block_count")),
        "intermediate_size": int(field(r, "llama.feed_forward_length")),
        "num_attention_heads": int(field(r, "llama.attention.head_count")),
        "num_key_value_heads": int(field(r, "llama.attention.head_count_kv")),
        "rms_norm_eps": float(field(r, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(r, "llama.rope.freq_base")),
        "vocab_size": int(field(r, "llama.vocab_size")),
        "max_position_embeddings": int(field(r, "llama.context_length")),
        "tie_word_embeddings": True,
        "rope_scaling": None,
    }
    cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    assert int(field(r, "llama.rope.dimension_count")) == cfg["head_dim"]
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
    per_layer = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    weights, types = {}, {}
    for t in r.tensors:
        base = t.name.removesuffix(".weight")
        if base.startswith("blk."):
            _, i, kind = base.split(".", 2)
            name = f"model.layers.{i}.{per_layer[kind]}.weight"
        else:
            name = names[base] + ".weight"
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        data = data.reshape(tuple(int(x) for x in reversed(t.shape)))
        if name.endswith("q_proj.weight"):
            data = llama_unpermute(data, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            data = llama_unpermute(data, cfg["num_key_value_heads"])
        weights[name] = data
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    assert "output.weight" not in {t.name for t in r.tensors}
    return cfg, weights, types


def main():
    mx.set_default_device(mx.cpu)
    path = gguf_path()
    if not path.exists():
        sys.exit(f"{path} is missing: run scripts/fetch-default-model.sh")
    r = gguf.GGUFReader(str(path))
    tok, control = build_tokenizer(r)
    cfg, weights, types = dequantised_llama(r)
    model = model_from_weights(cfg, weights)
    del weights

    label_ids = []
    for lab in LABELS:
        ids = tok.encode(lab, add_special_tokens=False)
        assert len(ids) == 1, (lab, ids)
        label_ids.append(ids[0])

    cases = []
    for msgs in PROMPTS:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) + PREFILL
        toks = tok.encode(text, add_special_tokens=False)
        for lab, lid in zip(LABELS, label_ids):
            assert tok.encode(text + lab, add_special_tokens=False) == toks + [lid], lab
        logits = last_logits(model, toks)
        c = case("smollm2", toks, logits, text=text, messages=msgs, prefill=PREFILL,
                 labels=LABELS)
        c["label_ids"] = label_ids
        c["label_logits"] = [float(logits[i]) for i in label_ids]
        cases.append(c)
        print(len(toks), "tokens; argmax", c["argmax"], repr(tok.decode([c["argmax"]])),
              "labels", [round(x, 3) for x in c["label_logits"]])

    out = {
        "reference": f"mlx_lm {mlx_lm.__version__} (mlx {mx.__version__}, CPU) float32 on the "
                     f"GGUF's tensors dequantised by gguf-py {gguf_version()} (q/k permutation "
                     "undone, tied embeddings)",
        "generator": "accelerator/tests/data/causal/make_smollm2_goldens.py",
        "gguf": {"file": path.name, "sha256": sha256(path), "tensor_types": types},
        "config": cfg,
        "control_tokens": control,
        "cases": cases,
    }
    (HERE / "smollm2-goldens.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
