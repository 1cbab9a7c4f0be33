"""End-to-end check of a running hunch with the official TypeSafe Python SDK (typesafe-sdk 0.7.5).

Run by tests/tests/sdk.rs with TYPESAFE_BASE_URL and TYPESAFE_API_KEY set. Every answer type is
parsed by the SDK's own models, bodies above 1 KiB go out zstd-compressed (asserted), and errors
come back as the SDK's typed exceptions. Prints one line per check; exits non-zero on failure.
"""

import math
import os
import sys

import typesafe_sdk as ts
from typesafe_sdk._core.compression import COMPRESSORS

assert "zstd" in COMPRESSORS, "the venv lacks zstd: install typesafe-sdk[zstd]"

# Real reads of long prompts on a loaded CPU take longer than the SDK's default 10 s timeout.
TIMEOUT = float(os.environ.get("HUNCH_E2E_SDK_TIMEOUT", "300"))

client = ts.TypeSafeClient(retry=ts.RetryPolicy(max_retries=0), timeout=TIMEOUT)


def finite(x):
    assert isinstance(x, float) and math.isfinite(x), x
    return x


# 1. models
models = client.models.list()
names = [m.name for m in models.models]
assert "jev-latest" in names, names
print("models:", names)

# 2. every answer type, small body (uncompressed)
questions = {
    "billing": ts.Noul(instructions="Is this message about billing?"),
    "team": ts.Choice(instructions="Which team?", criteria={"billing": "Payments", "technical": None, "sales team": "New purchases"}),
    "urgency": ts.Score(instructions="How urgent?", criteria=["Can wait", "This week", "Today"]),
    "one sided": ts.Noul(criteria={"true": "The customer is angry"}),
    "ünïcödé id ✓": ts.Choice(criteria={"only": None}),
}
r = client.system_one("I was charged twice. Please refund.", questions)
assert r.model != "jev-latest", r.model
assert list(r.answers) == list(questions), list(r.answers)
a = r.answers
assert 0.0 <= finite(a["billing"].noul) <= 1.0
assert a["team"].choice in ("billing", "technical", "sales team")
assert abs(sum(a["team"].probabilities.values()) - 1.0) < 1e-6
assert 0.0 <= finite(a["team"].confidence) <= 1.0
assert 0.0 <= finite(a["urgency"].score) <= 2.0
assert a["urgency"].legend == {0: "Can wait", 1: "This week", 2: "Today"}, a["urgency"].legend
assert a["ünïcödé id ✓"].choice == "only" and a["ünïcödé id ✓"].confidence == 1.0
assert isinstance(r.usage.input_tokens, int) and isinstance(r.usage.output_tokens, int)
print("answers ok:", {k: v.type for k, v in a.items()})

# 3. a big request: > 1 KiB, so the SDK sends it zstd-compressed (kept near 1.5 KiB of state: the
# real model's prefill grows faster than linearly with the prompt)
big_state = {"ticket": "word " * 300, "customer": {"name": "Zoë", "tier": "gold"}}
levels = [f"level {i}: " + "detail " * 10 for i in range(10)]
options = {f"option {i} with a long name": f"description {i}" for i in range(40)}
state_obj = ts.Score(instructions={"task": "rate"}, criteria=levels)

r2 = client.system_one(big_state, {"levels": state_obj, "opts": ts.Choice(criteria=options), "yn": ts.Noul(instructions=["is", "it"], criteria={"false": {"k": "v"}})})
assert set(r2.answers) == {"levels", "opts", "yn"}
assert len(r2.answers["opts"].probabilities) == 40
assert len(r2.answers["levels"].legend) == 10
print("big zstd request ok")

# Same request, compression off: identical answers (the body encoding never changes a read).
plain = ts.TypeSafeClient(compression=False, retry=ts.RetryPolicy(max_retries=0), timeout=TIMEOUT)
r3 = plain.system_one(big_state, {"levels": state_obj, "opts": ts.Choice(criteria=options), "yn": ts.Noul(instructions=["is", "it"], criteria={"false": {"k": "v"}})})
assert r3.answers["opts"].probabilities == r2.answers["opts"].probabilities
print("zstd and plain bodies agree")

# 4. errors arrive as the SDK's typed exceptions
try:
    # Past every model's limit (and the server's): 50 levels is the most any model reads.
    client.system_one("x", {"q": ts.Score(criteria=[f"l{i}" for i in range(51)])})
    raise AssertionError("51 levels accepted")
except ts.TypeSafeUnprocessableEntityError as e:
    assert "criteria" in str(e), str(e)
    print("422 ok:", str(e)[:120])
try:
    client.system_one("x", {"q": ts.Noul(instructions="?")}, model="no-such-model")
    raise AssertionError("unknown model accepted")
except ts.TypeSafeNotFoundError:
    print("404 ok")
try:
    client.system_one("x", {"where": ts.Box(instructions="the dog")})
    raise AssertionError("box accepted")
except ts.TypeSafeUnprocessableEntityError as e:
    assert "text-only" in str(e), str(e)
    print("box refused ok")

# 5. the async client too
import asyncio  # noqa: E402


async def main():
    async with ts.AsyncTypeSafeClient(timeout=TIMEOUT) as c:
        rr = await c.system_one({"a": [1, 2.5, None]}, {"q": ts.Noul(instructions="ok?")})
        assert 0.0 <= rr.answers["q"].noul <= 1.0


asyncio.run(main())
print("async ok")
print("SDK E2E OK")
