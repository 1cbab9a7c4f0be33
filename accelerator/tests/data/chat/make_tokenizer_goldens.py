#!/usr/bin/env python3
"""Reference data for `accelerator/tests/chat_tokenizer.rs`: ids and rendered chat templates for
the chat tokenizers in `accelerator/src/tokenizer/chat/`, from the projects the Rust code must
agree with.

Vocabularies:

* SmolLM2-135M-Instruct's GGUF (byte-level BPE, pre-tokenizer "smollm", ChatML template with a
  default system turn). The GGUF itself is not committed; pass its path (or set
  HUNCH_SMOLLM2_GGUF). Only the ids and rendered strings it yields are written.
* tiny-spm: a SentencePiece BPE model trained here (byte fallback, Gemma-style control tokens),
  written as a GGUF vocabulary (tokenizer.ggml.model "llama", laid out as llama.cpp's converter
  writes one) and as a Hugging Face folder converted by transformers from the same model, both
  with a Gemma-3-shaped chat template.
* tiny-bpe: a byte-level BPE trained here with `tokenizers`, written as GGUF vocabularies with the
  pre-tokenizers "qwen2" and "llama-bpe" and as a Hugging Face folder (qwen2's split).
* error fixtures: a GGUF with no tokenizer keys, and one naming an unknown pre-tokenizer.

References, per vocabulary:

* Hugging Face folders: transformers (`encode(add_special_tokens=False)`, `apply_chat_template(...,
  add_generation_prompt=True, enable_thinking=False)`).
* GGUF files: llama.cpp through llama-cpp-python (`tokenize(text, add_bos=False, special=True)`),
  the tokenizer the files are made for, when it is importable; and transformers' own GGUF
  tokenizer conversion (`integrations.gguf.convert_gguf_tokenizer`), fixed where it is known to
  split differently from llama.cpp (it has no split for "smollm" and falls back to GPT-2's regex,
  which keeps digit runs whole; llama.cpp and SmolLM2's own tokenizer.json isolate every digit).
  For tiny-spm, sentencepiece itself too. Where llama.cpp ran, its ids are the goldens and every
  disagreement of the others is printed; the script fails if transformers' ids disagree on
  SmolLM2.

Run:  /tmp/venv-tok/bin/python accelerator/tests/data/chat/make_tokenizer_goldens.py [SMOLLM2.gguf]
(venv: pip install transformers tokenizers gguf sentencepiece jinja2 numpy protobuf; no torch;
optionally llama-cpp-python, or LLAMA_CPP_SITE=<a site-packages that has it>.)

The committed goldens were made with llama-cpp-python 0.3.36, built from source on two cores in
about 25 minutes with
  CMAKE_ARGS="-DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
    -DGGML_OPENMP=OFF" pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36
and llama.cpp, transformers and sentencepiece agreed on every text.
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as sp_pb2
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GemmaTokenizer, PreTrainedTokenizerFast
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

if os.environ.get("LLAMA_CPP_SITE"):
    sys.path.append(os.environ["LLAMA_CPP_SITE"])
try:
    from llama_cpp import Llama
except ImportError:  # the goldens then come from transformers alone
    Llama = None

HERE = Path(__file__).resolve().parent
TINY_SPM = HERE / "tiny-spm"
TINY_BPE = HERE / "tiny-bpe"

TEXTS = [
    "Hello world! 123",
    "The capital of France is",
    "Café déjà vu. Ça va? Größe, naïve, São Paulo.",
    "日本語のテキストと中文字符，还有한국어.",
    "Emoji: 🤖🎉👍🏽 and 👨‍👩‍👧 family",
    "Numbers: 3.14159, 1234567890, 0.000001, -42, 1e10, 2024-06-01",
    "   leading spaces, trailing spaces   ",
    "multiple   spaces\tand\ttabs\n\nnewlines\r\nCRLF\n",
    "\n\n\n  \n \t\u00a0x\u3000y\u2028z",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>glued<|endoftext|>",
    "<|im_start <|im_end|| <|endoftext|><|endoftext|>",
    "<start_of_turn>user\nwhat?<end_of_turn>\n<start_of_turn>model\n",
    "<note> a user-defined token <note>",
    "def f(x):\n    return x ** 2  # square\n",
    '{"answer": "',
    '{"answer": ',
    '{"answer": "yes", "confidence": 0.93}',
    "It's, we'll, they're, I've, she'd, I'M, YOU'LL",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z a b c x y z AA AB ZZ",
    "0 1 2 3 4 5 6 7 8 9 10 99 100 1000",
    "\n",
    " ",
    "a",
    "",
]



def stress_texts(count=40, seed=7):
    """Seeded random texts over the characters where splits differ: letters of several scripts,
    digits, runs of mixed white space, contractions, punctuation, combining marks, emoji, and
    special-token texts whole and broken."""
    import random

    rng = random.Random(seed)
    pieces = [
        "a", "Z", "word", " word", "Hello", "é", "e\u0301", "ß", "İ", "日本", "한국", "ไทย", "Ω",
        "0", "7", "42", "1234", "3.14", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n",
        "\u00a0", "\u3000", "'s", "'LL", "'re", "n't", "!", "?", "...", "--", '"', "{", "}", ":",
        "<", ">", "|", "$", "+", "^", "~", "🤖", "👍🏽", "👨‍👩‍👧", "\u200b", "<|im_end|>",
        "<|im_start|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<note>", "<|im",
    ]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 14))) for _ in range(count)]


TEXTS += stress_texts()

SYSTEM_USER = [
    {"role": "system", "content": "You judge claims. Answer yes or no."},
    {"role": "user", "content": "Is the sky green?"},
]

CHATS = [
    SYSTEM_USER,
    [{"role": "user", "content": "  Is 17 a prime number?  "}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Say 日本 🤖 Café 123"},
    ],
]

# Gemma 3's template, in its shape: BOS written by the template, the system message folded into
# the first user turn, "model" as the assistant's role, `<start_of_turn>model\n` as the prompt.
# `.strip()` (a Python string method) stands where Gemma writes `| trim`, so pycompat is exercised.
GEMMA_STYLE_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if message['role'] == 'assistant' -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {{- message['content'].strip() }}\n"
    "    {{- '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{ '<start_of_turn>model\\n' }}\n"
    "{%- endif -%}\n"
)

# Qwen3's template, cut to what a system + user chat uses: `namespace`, `messages[::-1]`,
# `.startswith`/`.endswith`, `| trim`, and the empty think block that enable_thinking=False writes.
QWEN_STYLE_TEMPLATE = (
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string "
    "and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- set content = message.content | trim %}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
)

CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Is the sky green? No, the sky is blue.",
    "Answer yes or no. The answer is yes.",
    "You judge claims and give a calibrated answer.",
    "Hello! How can I help you today?",
    "Café déjà vu, naïve façade, São Paulo, Größe.",
    "Numbers like 3.14 and 2024 and 17 appear here.",
    "def main():\n    print('hello world')\n",
    '{"answer": "yes", "confidence": 0.9}',
    "It's a model; we'll see what they're saying.",
]

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def render(tok, chat):
    return tok.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def gguf_fields(path):
    """The tokenizer metadata of a GGUF, as transformers' `get_gguf_tokenizer` names it."""
    reader = gguf.GGUFReader(str(path))

    def value(key):
        field = reader.fields.get(key)
        if field is None:
            return None
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            if field.types[-1] == gguf.GGUFValueType.STRING:
                return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            return [field.parts[i].tolist()[0] for i in field.data]
        return field.contents()

    names = {
        "tokenizer.ggml.model": "tokenizer_type",
        "tokenizer.ggml.pre": "pre_tokenizer_type",
        "tokenizer.ggml.tokens": "tokens",
        "tokenizer.ggml.scores": "scores",
        "tokenizer.ggml.token_type": "token_type",
        "tokenizer.ggml.merges": "merges",
        "tokenizer.ggml.bos_token_id": "bos_token_id",
        "tokenizer.ggml.eos_token_id": "eos_token_id",
        "tokenizer.ggml.unknown_token_id": "unk_token_id",
        "tokenizer.ggml.padding_token_id": "pad_token_id",
        "tokenizer.ggml.add_space_prefix": "add_prefix_space",
    }
    tokenizer = {name: value(key) for key, name in names.items() if value(key) is not None}
    return value("general.architecture"), tokenizer, value("tokenizer.chat_template")


def transformers_from_gguf(path, fix_pre=None):
    """transformers' tokenizer for a GGUF vocabulary, built without torch."""
    architecture, tokenizer_dict, template = gguf_fields(path)
    backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    if fix_pre is not None:
        backend.pre_tokenizer = fix_pre
    tokens = tokenizer_dict["tokens"]
    special = {
        name: tokens[tokenizer_dict[key]]
        for name, key in [("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")]
        if key in tokenizer_dict
    }
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=template, **special)


class LlamaCpp:
    """llama.cpp's tokenizer for a GGUF file (vocabulary only), if llama-cpp-python is here."""

    def __init__(self, path):
        self.llm = Llama(model_path=str(path), vocab_only=True, verbose=False) if Llama else None

    def encode(self, text):
        if self.llm is None:
            return None
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)


def compare(name, texts, reference, others):
    """The reference's ids for each text; prints where another tokenizer disagrees."""
    out, disagreements = [], 0
    for text in texts:
        ids = reference(text)
        for other_name, other in others:
            theirs = other(text)
            if theirs is not None and theirs != ids:
                disagreements += 1
                print(f"{name}: {other_name} disagrees on {text!r}:\n  {ids}\n  {theirs}")
        out.append({"text": text, "ids": ids})
    return out, disagreements


def adds_bos(tok):
    """Whether transformers puts a BOS in front of a text when asked to add special tokens."""
    return tok.bos_token_id is not None and tok.encode("a")[:1] == [tok.bos_token_id]


def gguf_goldens(path, tok, label, extra_refs=()):
    """Goldens for a GGUF: llama.cpp's ids when it runs, else transformers'."""
    cpp = LlamaCpp(path)
    _, fields, _ = gguf_fields(path)
    if cpp.llm is not None:
        with_bos = cpp.llm.tokenize(b"a", add_bos=True, special=True)
        bos = [with_bos[0]] if len(with_bos) > len(cpp.encode("a")) else []
    else:
        bos = [fields["bos_token_id"]] if gguf_add_bos(path) else []
    if cpp.llm is not None:
        reference, source = cpp.encode, "llama.cpp"
        others = [("transformers", lambda t: encode(tok, t)), *extra_refs]
    else:
        reference, source = (lambda t: encode(tok, t)), "transformers"
        others = list(extra_refs)
    texts, disagreements = compare(label, TEXTS, reference, others)
    chats = []
    for chat in CHATS:
        rendered = render(tok, chat)
        chats.append({"messages": chat, "rendered": rendered, "ids": reference(rendered)})
    goldens = {
        "vocab_size": len(fields["tokens"]),
        "ids_from": source,
        "bos": bos,
        "texts": texts,
        "chats": chats,
    }
    return goldens, disagreements


def gguf_add_bos(path):
    """tokenizer.ggml.add_bos_token, defaulted as llama.cpp defaults it."""
    field = gguf.GGUFReader(str(path)).fields.get("tokenizer.ggml.add_bos_token")
    if field is not None:
        return bool(field.contents())
    _, fields, _ = gguf_fields(path)
    return fields["tokenizer_type"] == "llama" or fields.get("pre_tokenizer_type") in (
        "llama3", "llama-v3", "llama-bpe"
    )


def smollm2_goldens(path):
    tok = transformers_from_gguf(
        path,
        fix_pre=pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        ),
    )
    goldens, disagreements = gguf_goldens(path, tok, "smollm2")
    if disagreements:
        sys.exit("transformers and llama.cpp disagree on SmolLM2: fix the reference first")
    return {
        "file": Path(path).name,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        **goldens,
    }


def train_tiny_spm(workdir):
    corpus = Path(workdir) / "corpus.txt"
    corpus.write_text("\n".join(CORPUS_LINES * 20) + "\n", encoding="utf-8")
    prefix = str(Path(workdir) / "tiny")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=prefix,
        model_type="bpe",
        vocab_size=400,
        byte_fallback=True,
        character_coverage=1.0,
        # Gemma's layout: pad 0, eos 1, bos 2, unk 3, no dummy prefix, digits split, spaces kept.
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        control_symbols=["<start_of_turn>", "<end_of_turn>"],
        user_defined_symbols=["<note>"],
        add_dummy_prefix=False,
        split_digits=True,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        num_threads=1,
        minloglevel=2,
    )
    return prefix + ".model"


def write_tiny_spm_gguf(model_file, out):
    """The vocabulary as llama.cpp's converter writes a SentencePiece one: the pieces, their
    scores and types (sentencepiece's numbering is llama.cpp's: 1 normal .. 6 byte)."""
    proto = sp_pb2.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    writer = gguf.GGUFWriter(str(out), "gemma3")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([p.piece for p in proto.pieces])
    writer.add_token_scores([p.score for p in proto.pieces])
    writer.add_token_types([int(p.type) for p in proto.pieces])
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(GEMMA_STYLE_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_spm_goldens():
    if TINY_SPM.exists():
        shutil.rmtree(TINY_SPM)
    TINY_SPM.mkdir()
    hf_dir = TINY_SPM / "hf"
    with tempfile.TemporaryDirectory() as work:
        model_file = train_tiny_spm(work)
        sp = spm.SentencePieceProcessor(model_file=model_file)
        write_tiny_spm_gguf(model_file, TINY_SPM / "tiny-spm.gguf")
        src = Path(work) / "src"
        src.mkdir()
        shutil.copy(model_file, src / "tokenizer.model")
        hf = GemmaTokenizer.from_pretrained(str(src), add_bos_token=True, add_eos_token=False)
        hf.chat_template = GEMMA_STYLE_TEMPLATE
        hf.save_pretrained(str(hf_dir))
        clean_config(hf_dir)
        # sentencepiece sees control symbols as text; split them out as llama.cpp does.
        controls = {"<start_of_turn>": 4, "<end_of_turn>": 5}

        def spm_ids(text):
            out, rest = [], text
            while rest:
                at = [(rest.find(c), c) for c in controls if rest.find(c) >= 0]
                if not at:
                    out += sp.encode(rest)
                    break
                pos, c = min(at)
                out += sp.encode(rest[:pos]) + [sp.piece_to_id(c)]
                rest = rest[pos + len(c):]
            return out

        from_dir = PreTrainedTokenizerFast.from_pretrained(str(hf_dir))
        gguf_part, _ = gguf_goldens(
            TINY_SPM / "tiny-spm.gguf",
            from_dir,
            "tiny-spm gguf",
            extra_refs=[("sentencepiece", spm_ids)],
        )
    hf_texts, _ = compare("tiny-spm hf", TEXTS, lambda t: encode(from_dir, t), [])
    hf_chats = []
    for chat in CHATS:
        rendered = render(from_dir, chat)
        hf_chats.append({"messages": chat, "rendered": rendered, "ids": encode(from_dir, rendered)})
    return (
        {"bos_token": "<bos>", **gguf_part},
        hf_goldens(from_dir, hf_texts, hf_chats),
    )


def hf_goldens(tok, texts, chats):
    bos = [tok.bos_token_id] if adds_bos(tok) else []
    return {"vocab_size": len(tok), "bos": bos, "texts": texts, "chats": chats}


def clean_config(hf_dir):
    """Drop what save_pretrained writes about this machine (the temporary source path)."""
    path = Path(hf_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    for key in ("vocab_file", "is_local", "local_files_only"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def train_tiny_bpe():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS_LINES * 20, trainer)
    return tok


def write_tiny_bpe_gguf(tok, pre, out):
    state = json.loads(tok.to_str())
    vocab = state["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    specials = {a["content"] for a in state["added_tokens"]}
    writer = gguf.GGUFWriter(str(out), "qwen3")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab["<|endoftext|>"])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(QWEN_STYLE_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_bpe_goldens():
    if TINY_BPE.exists():
        shutil.rmtree(TINY_BPE)
    (TINY_BPE / "hf").mkdir(parents=True)
    tok = train_tiny_bpe()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        chat_template=QWEN_STYLE_TEMPLATE,
    )
    hf.save_pretrained(str(TINY_BPE / "hf"))
    clean_config(TINY_BPE / "hf")
    from_dir = PreTrainedTokenizerFast.from_pretrained(str(TINY_BPE / "hf"))
    hf_texts, _ = compare("tiny-bpe hf", TEXTS, lambda t: encode(from_dir, t), [])
    hf_chats = []
    for chat in CHATS:
        rendered = render(from_dir, chat)
        hf_chats.append({"messages": chat, "rendered": rendered, "ids": encode(from_dir, rendered)})
    out = {"hf": hf_goldens(from_dir, hf_texts, hf_chats)}
    for pre in ["qwen2", "llama-bpe"]:
        path = TINY_BPE / f"tiny-bpe-{pre}.gguf"
        write_tiny_bpe_gguf(tok, pre, path)
        part, _ = gguf_goldens(path, transformers_from_gguf(path), f"tiny-bpe {pre}")
        out[pre] = part
    return out


def write_error_fixtures():
    bad = HERE / "bad"
    bad.mkdir(exist_ok=True)
    writer = gguf.GGUFWriter(str(bad / "no-tokenizer.gguf"), "llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    writer = gguf.GGUFWriter(str(bad / "unknown-pre.gguf"), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("brand-new-pre")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_types([1, 1, 1])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    smollm2 = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "HUNCH_SMOLLM2_GGUF",
        str(Path.home() / ".cache/hunch/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    if Llama is None:
        print("llama-cpp-python is not importable: GGUF goldens come from transformers alone")
    goldens = {"smollm2": smollm2_goldens(smollm2)}
    goldens["tiny_spm_gguf"], goldens["tiny_spm_hf"] = tiny_spm_goldens()
    goldens["tiny_bpe"] = tiny_bpe_goldens()
    write_error_fixtures()
    out = HERE / "tokenizer_goldens.json"
    out.write_text(json.dumps(goldens, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
