"""Compare HF's Python `tokenizers` with hunch-ckpt tokenize on the tiny tokenizer."""
# Usage: hunch-ckpt random --preset tiny --out /tmp/t && python xcheck_tokenizer.py /tmp/t target/debug/hunch-ckpt
# (needs pip install tokenizers; checked with tokenizers 0.23.3)
import json, subprocess, sys
from tokenizers import Tokenizer
d = sys.argv[1]
tok = Tokenizer.from_file(f"{d}/tokenizer.json")
texts = [
    "q1: yes\nq2: A\nq3: 7\nq4: AB",
    "q1yes q2AB q3z",
    "<|channel>thought\n<channel|>q1: no<turn|><pad><pad>",
    "Answer a fixed set of questions about the state the user provides. Zoë «hi» {ok} — 🙂\ttab",
    "  leading and trailing  ",
]
bad = 0
for t in texts:
    py = tok.encode(t, add_special_tokens=False).ids
    rs = json.loads(subprocess.check_output([sys.argv[2], "tokenize", d, t]))
    dec = tok.decode(py, skip_special_tokens=False)
    ok = py == rs and dec == t
    bad += not ok
    print("OK " if ok else "BAD", len(py), repr(t[:40]), "" if ok else (py, rs, dec))
print("python tokenizers agrees" if not bad else f"{bad} mismatches")
