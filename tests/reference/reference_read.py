#!/usr/bin/env python3
"""Python reference of Hunch's System One read, on the reference model code.

    reference_read.py --ckpt DIR --request FILE [--dtype float32] [--canvas-cap 64]
                      [--max-prompt-tokens 12288] [--no-rereads] [--mlx-vlm-src DIR]

Reads Hunch's internal read request (JSON, see docs/reference-read.md), plans the reads the way
oMLX's System One endpoint does (jundot/omlx `omlx/api/systemone.py`, itself djev's read), runs them
on mlx_vlm 0.7.10's DiffusionGemma (mlx, CPU) and prints one JSON object on stdout:

    {"distributions": [[p, ...], ...], "usage": {"input_tokens", "output_tokens"},
     "reads": [{"prompt_ids", "canvas", "slots": [[pos, [label ids]]], "draw_seeds"}],
     "system_prompts": [...]}

A request the read rejects prints {"error": {"kind", "message", "question"?}} and exits with 2.
Progress and timings go to stderr.
"""
import argparse
import glob
import importlib
import importlib.util
import json
import math
import os
import random
import sys
import time
import types

# ----------------------------------------------------------------------------------------------------
# constants of the read (docs/reference-read.md: "what it follows")
# ----------------------------------------------------------------------------------------------------
EMPTY_THOUGHT = "<|channel>thought\n<channel|>"
TURN_CLOSE = "<turn|>"
CANVAS_STEP = 16
CANVAS_HARD_CAP = 128
MAX_CHOICES = 255
MAX_SCORE_LEVELS = 10
TOP_K = 20
REREAD_THRESHOLD = 0.1
REREAD_DRAWS = 4
DEFAULT_SEED = 42
GROUP_SEED_STRIDE = 104729
DRAW_SEED_STRIDE = 7919
LINES_MAX_QUESTIONS = 10
PREAMBLE = (
    "Answer a fixed set of questions about the state the user provides. "
    "Each question lists its allowed answers; reply with exactly one label per question.\n"
)
# (join between questions, lead before a label, format instruction closing the system text)
LINES = ("\n", "{id}: ", 'Reply with one line per question, in this order, formatted as "id: label".')
INDEXED = (" ", "{id}", "Reply on one line with each question's id immediately followed by its label, "
           "separated by single spaces.")


class ReadRejected(Exception):
    def __init__(self, kind, message, question=None):
        super().__init__(message)
        self.kind, self.message, self.question = kind, message, question


def log(msg):
    print(f"[reference_read {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def text_of(value):
    """Instructions, descriptions and the state: strings are stripped (Python str.strip), None is
    empty, anything else is JSON with non-ASCII kept."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    return json.dumps(value, ensure_ascii=False)


# ----------------------------------------------------------------------------------------------------
# tokenizer and chat prompt
# ----------------------------------------------------------------------------------------------------
class Tok:
    """The checkpoint's tokenizer.json through the `tokenizers` package; special tokens by text."""

    def __init__(self, ckpt, text_config):
        from tokenizers import Tokenizer

        path = os.path.join(ckpt, "tokenizer.json")
        if not os.path.isfile(path):
            raise SystemExit(f"no tokenizer.json in {ckpt}")
        self.tk = Tokenizer.from_file(path)
        self.config = {}
        cfg_path = os.path.join(ckpt, "tokenizer_config.json")
        if os.path.isfile(cfg_path):
            with open(cfg_path) as f:
                self.config = json.load(f)
        self.template, self.template_source = None, None
        jinja_path = os.path.join(ckpt, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            with open(jinja_path) as f:
                self.template, self.template_source = f.read(), "chat_template.jinja"
        elif isinstance(self.config.get("chat_template"), str):
            self.template, self.template_source = self.config["chat_template"], "tokenizer_config.json"
        self.turn_close = self.token_id(TURN_CLOSE)
        pad = self.special_text("pad_token")
        self.pad = self.tk.token_to_id(pad) if pad else None
        if self.pad is None:
            self.pad = text_config.get("pad_token_id", 0)

    def special_text(self, name):
        v = self.config.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        if v is None:
            v = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}.get(name)
        return v

    def token_id(self, text):
        i = self.tk.token_to_id(text)
        if i is None:
            raise SystemExit(f"tokenizer has no token {text!r}")
        return i

    def encode(self, text):
        return list(self.tk.encode(text, add_special_tokens=False).ids)

    def chat_prompt(self, system, state):
        """Token ids of [system, user] with the generation prompt and thinking off."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": state}]
        if self.template is not None:
            text = self.render(messages)
        else:
            # what Gemma's chat template renders for these two messages (contents trimmed), with
            # add_generation_prompt=True and enable_thinking=False (docs/model.md, "Chat format")
            text = (f"<bos><|turn>system\n{system.strip()}<turn|>\n"
                    f"<|turn>user\n{state.strip()}<turn|>\n"
                    f"<|turn>model\n<|channel>thought\n<channel|>")
        return self.encode(text)

    def render(self, messages):
        """HF's apply_chat_template rendering: sandboxed jinja2, trim_blocks + lstrip_blocks,
        loopcontrols, tojson, raise_exception, strftime_now, the special tokens as variables."""
        from datetime import datetime

        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        specials = {k: self.special_text(k) for k in ("bos_token", "eos_token", "pad_token")}
        for k in ("unk_token",):
            if self.special_text(k):
                specials[k] = self.special_text(k)
        return env.from_string(self.template).render(
            messages=messages, add_generation_prompt=True, enable_thinking=False, **specials)


# ----------------------------------------------------------------------------------------------------
# planning: questions -> reads (prompt ids, canvas, slots)
# ----------------------------------------------------------------------------------------------------
def score_labels(levels):
    if levels <= 9:
        return [str(i + 1) for i in range(levels)]
    return [chr(ord("A") + i) for i in range(levels)]


def choice_labels(tok):
    """Labels that stay a single, distinct token after "q1: ": A-Z, a-z, AA..ZZ, first 255."""
    base = tok.encode("q1: A")
    upper = [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    cands = upper + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [a + b for a in upper for b in upper]
    out, seen = [], set()
    for c in cands:
        ids = tok.encode("q1: " + c)
        if len(ids) == len(base) and ids[:-1] == base[:-1] and ids[-1] not in seen:
            seen.add(ids[-1])
            out.append(c)
            if len(out) == MAX_CHOICES:
                break
    return out


def answer_text(group, label_index, fmt):
    join, lead, _ = fmt
    return join.join(lead.format(id=q["id"]) + q["labels"][li] for q, li in zip(group, label_index))


def system_text(group, fmt):
    s = PREAMBLE
    for q in group:
        s += f"\nQuestion {q['id']}: {q['instructions']}\n"
        for (name, desc), label in zip(q["options"], q["labels"]):
            if q["type"] == "choice":
                s += f"  {label}: {name} ({desc})\n" if desc else f"  {label}: {name}\n"
            elif q["type"] == "score":
                s += f"  {label}: {desc}\n"
            else:
                s += f"  {label}: {desc}\n" if desc else f"  {label}\n"
    return s + "\n" + fmt[2]


def plan(request, tok, cap, max_prompt_tokens):
    """Returns (forced {index: [1.0]}, reads). Mirrors oMLX's SystemOnePlan."""
    labels_pool = choice_labels(tok)
    head = tok.encode(EMPTY_THOUGHT)
    forced, qs = {}, []
    for qi, q in enumerate(request["questions"]):
        kind = q.get("type")
        if kind == "choice":
            opts = q.get("options") or []
            if not opts:
                raise ReadRejected("invalid_question", f"Choice question must have at least one choice: {qi}", qi)
            limit = min(MAX_CHOICES, len(labels_pool))
            if len(opts) > limit:
                raise ReadRejected("invalid_question", f"Too many choices. Must have at most {limit} choices.", qi)
            if len(opts) == 1:
                forced[qi] = [1.0]
                continue
            options = [(o["name"], text_of(o.get("description"))) for o in opts]
            labels = labels_pool[:len(options)]
        elif kind == "score":
            levels = q.get("levels") or []
            if not levels:
                raise ReadRejected("invalid_question", f"Score question must have at least one level: {qi}", qi)
            if len(levels) > MAX_SCORE_LEVELS:
                raise ReadRejected("invalid_question",
                                   f"Too many score levels. Must have at most {MAX_SCORE_LEVELS} levels.", qi)
            if len(levels) == 1:
                forced[qi] = [1.0]
                continue
            options = [(str(i), text_of(d)) for i, d in enumerate(levels)]
            labels = score_labels(len(options))
        elif kind == "noul":
            options = [("yes", text_of(q.get("yes"))), ("no", text_of(q.get("no")))]
            labels = ["yes", "no"]
        else:
            raise ReadRejected("invalid_question", f"unknown question type {kind!r}", qi)
        qs.append({"index": qi, "id": f"q{len(qs) + 1}", "type": kind,
                   "instructions": text_of(q.get("instructions")), "options": options, "labels": labels})
    if not qs:
        return forced, []
    fmt = LINES if len(qs) <= LINES_MAX_QUESTIONS else INDEXED

    # fewest groups, in order, whose template (head + answer + turn close) fits the cap
    groups, group = [], []
    for q in qs:
        trial = group + [q]
        need = len(head) + len(tok.encode(answer_text(trial, [0] * len(trial), fmt))) + 1
        if group and need > cap:
            groups.append(group)
            group = [q]
        else:
            group = trial
    groups.append(group)

    state = text_of(request.get("state"))
    reads = []
    for group in groups:
        system = system_text(group, fmt)
        prompt_ids = tok.chat_prompt(system, state)
        if max_prompt_tokens and len(prompt_ids) > max_prompt_tokens:
            raise ReadRejected("prompt_too_long", f"Prompt too long: {len(prompt_ids)} tokens exceeds max "
                               f"context window of {max_prompt_tokens} tokens")
        base = [0] * len(group)
        template = head + tok.encode(answer_text(group, base, fmt))
        slots = []
        for gi, q in enumerate(group):
            pos, ids_of = None, [0] * len(q["labels"])
            for li in range(1, len(q["labels"])):
                variant = list(base)
                variant[gi] = li
                ids = head + tok.encode(answer_text(group, variant, fmt))
                diffs = [i for i, (a, b) in enumerate(zip(ids, template)) if a != b]
                if len(ids) != len(template) or len(diffs) != 1 or (pos is not None and diffs[0] != pos):
                    raise ReadRejected("invalid_question", "labels do not share one template slot", q["index"])
                pos = diffs[0]
                ids_of[li] = ids[pos]
            ids_of[0] = template[pos]
            if len(set(ids_of)) != len(ids_of):
                raise ReadRejected("invalid_question", "two labels tokenize to the same id", q["index"])
            slots.append((pos, ids_of))
        need = len(template) + 1
        width = min(cap, -(-need // CANVAS_STEP) * CANVAS_STEP)
        canvas = template + [tok.turn_close] + [tok.pad] * (width - need)
        reads.append({"questions": group, "system": system, "prompt_ids": prompt_ids, "canvas": canvas,
                      "slots": slots, "rows": canvas.index(tok.turn_close) + 1})
    return forced, reads


# ----------------------------------------------------------------------------------------------------
# noise and slot statistics
# ----------------------------------------------------------------------------------------------------
def noised(canvas, slots, seed, vocab):
    """djev's draw: random.Random(seed), one randrange(vocab) per slot in slot order."""
    rng = random.Random(seed)
    out = list(canvas)
    for pos, _ in slots:
        out[pos] = rng.randrange(vocab)
    return out


def slot_reading(logprobs_row, label_ids):
    """logprobs_row: full-vocab log_softmax (numpy float32) at one slot. Returns (label
    distribution, entropy over top-20 ∪ labels) computed as oMLX does from the returned set."""
    import numpy as np

    top = np.argsort(-logprobs_row, kind="stable")[:TOP_K]
    returned = {int(i): float(logprobs_row[i]) for i in top}
    for i in label_ids:
        returned[int(i)] = float(logprobs_row[i])
    lps = [returned[i] for i in label_ids]
    m = max(lps)
    w = [math.exp(lp - m) for lp in lps]
    total = sum(w)
    entropy = -sum(math.exp(lp) * lp for lp in returned.values())
    return [x / total for x in w], entropy


# ----------------------------------------------------------------------------------------------------
# the reference model (mlx_vlm 0.7.10 diffusion_gemma, imported without package __init__ files)
# ----------------------------------------------------------------------------------------------------
def import_reference(src):
    """Load mlx_vlm.models.diffusion_gemma's modules with stub packages in place of the package
    __init__ files of every package of mlx_vlm (diffusion_gemma reaches into gemma4, qwen3_5,
    qwen3_vl, speculative): those __init__ files pull processors, transformers, requests, ... that
    the model code does not need. Every model module itself is mlx_vlm's unmodified file."""
    if src:
        src = os.path.abspath(src)
        pkg = src if os.path.basename(src.rstrip("/")) == "mlx_vlm" else os.path.join(src, "mlx_vlm")
    else:
        spec = importlib.util.find_spec("mlx_vlm")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("mlx_vlm not found: run tests/reference/setup.sh or pass --mlx-vlm-src")
        pkg = list(spec.submodule_search_locations)[0]
    stubs = []
    for root, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        if root == pkg or "__init__.py" in files:
            rel = os.path.relpath(root, pkg)
            name = "mlx_vlm" if rel == "." else "mlx_vlm." + rel.replace(os.sep, ".")
            stubs.append((name, root))
    for name, path in stubs:
        m = types.ModuleType(name)
        m.__path__ = [path]
        sys.modules[name] = m
    # The model's terminal visualizer (display only) patches mlx_vlm's generation engine at import,
    # which imports transformers; the read never generates, so it gets an inert stand-in.
    vis = types.ModuleType("mlx_vlm.models.diffusion_gemma.visualizer")
    vis.make_unmasking_visualizer = lambda *a, **k: None
    sys.modules[vis.__name__] = vis
    C = importlib.import_module("mlx_vlm.models.diffusion_gemma.config")
    L = importlib.import_module("mlx_vlm.models.diffusion_gemma.language")
    D = importlib.import_module("mlx_vlm.models.diffusion_gemma.diffusion_gemma")
    S = importlib.import_module("mlx_vlm.models.switch_layers")
    return C, L, D, S, pkg


def read_config(ckpt):
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    tc = dict(cfg.get("text_config") or {})
    # HF-serialised spelling: per_layer_config {"<layer>": {head_dim, num_key_value_heads}} for the
    # full-attention layers instead of global_head_dim / num_global_key_value_heads
    plc = tc.pop("per_layer_config", None) or {}
    lt = tc.get("layer_types")
    for k, v in plc.items():
        if lt is None or lt[int(k)] == "full_attention":
            if "global_head_dim" not in tc and "head_dim" in v:
                tc["global_head_dim"] = v["head_dim"]
            if "num_global_key_value_heads" not in tc and "num_key_value_heads" in v:
                tc["num_global_key_value_heads"] = v["num_key_value_heads"]
    if tc.get("attention_k_eq_v", True) is False:
        raise SystemExit("attention_k_eq_v=false is not supported by mlx_vlm's DiffusionGemma")
    cfg["text_config"] = tc
    cfg["vision_config"] = None  # text-only reads never use the vision tower
    return cfg


class Model:
    def __init__(self, ckpt, dtype_name, mlx_vlm_src):
        import mlx.core as mx

        self.mx = mx
        mx.set_default_device(mx.cpu)
        C, L, D, S, self.pkg = import_reference(mlx_vlm_src)
        self.L = L
        dtype = getattr(mx, dtype_name)
        if dtype != mx.float32:
            # mlx-cpu's gather_mm (dense MoE experts) only runs in float32: run the experts in f32
            def call(this, x, indices, sorted_indices=False):
                w = this["weight"]
                y = mx.gather_mm(x.astype(mx.float32), w.swapaxes(-1, -2), rhs_indices=indices,
                                 sorted_indices=sorted_indices)
                if "bias" in this:
                    y = y + mx.expand_dims(this["bias"][indices].astype(mx.float32), -2)
                return y.astype(x.dtype)

            S.SwitchLinear.__call__ = call
        self.cfg = read_config(ckpt)
        mc = C.ModelConfig.from_dict(self.cfg)
        self.model = D.Model(mc)
        files = sorted(glob.glob(os.path.join(ckpt, "*.safetensors")))
        if not files:
            raise SystemExit(f"no *.safetensors in {ckpt}")
        weights = {}
        for f in files:
            weights.update(mx.load(f))
        weights = self.model.sanitize(weights)
        out = []
        for k, v in weights.items():
            if mx.issubdtype(v.dtype, mx.floating):
                tgt = mx.float32 if (dtype != mx.float32 and ".experts." in k) else dtype
                if v.dtype != tgt:
                    v = v.astype(tgt)
            out.append((k, v))
        self.model.load_weights(out, strict=True)
        mx.eval(self.model.parameters())
        self.vocab = int(self.cfg["text_config"]["vocab_size"])

    def prefill(self, prompt_ids):
        mx = self.mx
        ids = mx.array([prompt_ids], dtype=mx.int32)
        cache = self.model.diffusion_prefill_cache(ids, cache=self.model.make_cache(), chunk_prefill=False)
        mx.eval([c.state for c in cache])
        return cache

    def logprobs(self, cache, canvases):
        """One decoder pass over B canvases against the batch-1 prefill (K/V broadcast to B);
        first step, no self-conditioning. Returns log_softmax of the softcapped fp32 logits,
        numpy [B, W, vocab]."""
        import numpy as np

        mx, L = self.mx, self.L
        B = len(canvases)

        class Prefix:  # read-only view of one layer's encoder cache, broadcast to the batch
            def __init__(self, c):
                k, v = L._cache_state(c)
                self.keys = k
                self.offset = c.offset
                self.decoder_state = (mx.broadcast_to(k, (B,) + tuple(k.shape[1:])),
                                      mx.broadcast_to(v, (B,) + tuple(v.shape[1:])))

        canv = mx.array(canvases, dtype=mx.int32)
        logits = self.model.diffusion_decoder_logits(canv, cache=[Prefix(c) for c in cache])
        logits = logits.astype(mx.float32)
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        mx.eval(lp)
        return np.array(lp)


# ----------------------------------------------------------------------------------------------------
def run(args):
    with open(args.request) as f:
        request = json.load(f)
    options = request.get("options") or {}
    seed = options.get("seed")
    seed = DEFAULT_SEED if seed is None else int(seed)
    fixed_draws = options.get("draws")
    with open(os.path.join(args.ckpt, "config.json")) as f:
        raw_cfg = json.load(f)
    text_cfg = raw_cfg.get("text_config") or {}
    cap = min(args.canvas_cap, CANVAS_HARD_CAP, int(raw_cfg.get("canvas_length", CANVAS_HARD_CAP)))
    tok = Tok(args.ckpt, text_cfg)
    if tok.template_source:
        log(f"chat prompt rendered with the checkpoint's template ({tok.template_source})")
    forced, reads = plan(request, tok, cap, args.max_prompt_tokens)

    dists = {i: p for i, p in forced.items()}
    out_reads = []
    if reads:
        t0 = time.perf_counter()
        model = Model(args.ckpt, args.dtype, args.mlx_vlm_src)
        log(f"loaded {args.ckpt} ({args.dtype}) in {time.perf_counter() - t0:.2f}s")
        vocab = model.vocab
        for k, rd in enumerate(reads):
            group_seed = seed + k * GROUP_SEED_STRIDE
            t0 = time.perf_counter()
            cache = model.prefill(rd["prompt_ids"])

            def draw(seeds):
                canvases = [noised(rd["canvas"], rd["slots"], s, vocab) for s in seeds]
                lp = model.logprobs(cache, canvases)
                return [[slot_reading(lp[b, pos], ids) for pos, ids in rd["slots"]] for b in range(len(seeds))]

            if fixed_draws is not None:
                seeds = [group_seed + i * DRAW_SEED_STRIDE for i in range(int(fixed_draws))]
                draws = draw(seeds)
            else:
                seeds = [group_seed]
                draws = draw(seeds)
                if not args.no_rereads and max(h for _, h in draws[0]) > REREAD_THRESHOLD:
                    more = [group_seed + 1 + j * DRAW_SEED_STRIDE for j in range(REREAD_DRAWS - 1)]
                    seeds += more
                    draws += draw(more)
            log(f"read {k}: prompt {len(rd['prompt_ids'])} tokens, canvas {len(rd['canvas'])}, "
                f"{len(rd['slots'])} slots, {len(seeds)} draws, {time.perf_counter() - t0:.2f}s")
            for gi, q in enumerate(rd["questions"]):
                per_draw = [d[gi][0] for d in draws]
                dists[q["index"]] = [sum(p[li] for p in per_draw) / len(per_draw)
                                     for li in range(len(q["labels"]))]
            out_reads.append({"prompt_ids": rd["prompt_ids"], "canvas": rd["canvas"],
                              "slots": [[pos, ids] for pos, ids in rd["slots"]], "draw_seeds": seeds})
    n = len(request["questions"])
    return {
        "distributions": [dists[i] for i in range(n)],
        "usage": {"input_tokens": max((len(r["prompt_ids"]) for r in reads), default=0),
                  "output_tokens": sum(r["rows"] for r in reads)},
        "reads": out_reads,
        "system_prompts": [r["system"] for r in reads],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="HF-layout checkpoint dir (config.json, *.safetensors, tokenizer.json)")
    ap.add_argument("--request", required=True, help="Hunch read request (JSON file)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--canvas-cap", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=12288)
    ap.add_argument("--no-rereads", action="store_true", help="always one draw per read")
    ap.add_argument("--mlx-vlm-src", default=os.environ.get("MLX_VLM_SRC"),
                    help="dir containing the mlx_vlm package (default: the installed one)")
    args = ap.parse_args()
    try:
        result = run(args)
    except ReadRejected as e:
        err = {"kind": e.kind, "message": e.message}
        if e.question is not None:
            err["question"] = e.question
        print(json.dumps({"error": err}))
        sys.exit(2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
