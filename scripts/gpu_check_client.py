#!/usr/bin/env python3
"""The client half of scripts/gpu-check.sh: System One requests to a running `hunch serve` over
HTTP, alone and from N concurrent clients (standard library only, so it runs on any machine).

Every request: a state calibrated so that each read's prompt is about --state-tokens tokens (from
the server's own `usage.input_tokens`), the same 3 questions, each read alone (noul, choice, score), fixed draws (`x_draws`) and a
fixed seed (`x_seed`). Each request's state differs from its first word on, so no prefix cache
skips its prefill. Prints every latency, then p50 alone, requests/s and p50 with N clients, the
forward passes per request (from /metrics) and, given the checkpoint's bytes and the device's
memory bandwidth, the weight-bandwidth floor: forwards × bytes / bandwidth, the time a request
would take if each forward did nothing but stream the weights once.
"""
import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request

WORDS = ("the customer wrote again about the invoice and the delivery that arrived late while "
         "the support team was busy with the release and nobody answered the phone").split()


def post(url, body, timeout):
    request = urllib.request.Request(
        url + "/v1/systemone", data=json.dumps(body).encode(),
        headers={"content-type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.load(response)
    return time.perf_counter() - started, answer


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def body(args, words, n):
    state = f"Ticket {n}: " + " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return {
        "model": args.model, "state": state, "x_seed": args.seed, "x_draws": args.draws,
        "x_questions": "isolated",
        "questions": {
            "urgent": {"type": "noul", "instructions": "Is this urgent?"},
            "team": {"type": "choice", "instructions": "Which team should handle it?",
                     "criteria": {"billing": "Payments", "technical": "Bugs", "sales": None}},
            "mood": {"type": "score", "instructions": "How upset is the customer?",
                     "criteria": ["Calm", "Annoyed", "Furious"]},
        },
    }


QUESTIONS = 3


def prompt_tokens(answer):
    """Prompt tokens of one read: each question is read alone (x_questions=isolated)."""
    return answer["usage"]["input_tokens"] / QUESTIONS


def calibrate(args):
    """The number of words whose per-read prompt is closest to --state-tokens (two probes)."""
    _, small = post(args.url, body(args, 50, 0), args.timeout)
    _, large = post(args.url, body(args, 250, 1), args.timeout)
    t_small, t_large = prompt_tokens(small), prompt_tokens(large)
    per_word = max((t_large - t_small) / 200, 1e-3)
    words = max(1, round(50 + (args.state_tokens - t_small) / per_word))
    _, check = post(args.url, body(args, words, 2), args.timeout)
    return words, prompt_tokens(check)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--state-tokens", type=int, default=600)
    p.add_argument("--draws", type=int, default=4)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--weights-bytes", type=float, default=0)
    p.add_argument("--bandwidth", type=float, default=0, help="device memory bytes/s")
    args = p.parse_args()

    words, tokens = calibrate(args)
    print(f"state: {words} words -> {tokens:.0f} prompt tokens per read (asked ~{args.state_tokens});"
          f" {QUESTIONS} questions read alone, x_draws={args.draws}, x_seed={args.seed}")

    forwards_before = metric(args.url, "hunch_model_forwards_total")
    alone = []
    for i in range(args.reps):
        seconds, answer = post(args.url, body(args, words, 1000 + i), args.timeout)
        alone.append(seconds)
        print(f"alone {i}: {seconds * 1000:.1f} ms, input_tokens={answer['usage']['input_tokens']}")
    forwards = (metric(args.url, "hunch_model_forwards_total") - forwards_before) / args.reps
    p50_alone = statistics.median(alone)

    latencies, lock, stop = [], threading.Lock(), time.perf_counter() + args.seconds
    errors = []

    def client(c):
        k = 0
        while time.perf_counter() < stop:
            try:
                seconds, _ = post(args.url, body(args, words, 100000 * (c + 1) + k), args.timeout)
                with lock:
                    latencies.append(seconds)
            except Exception as e:  # a failed request is counted and reported, not fatal
                with lock:
                    errors.append(str(e))
            k += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    rate = len(latencies) / elapsed

    print(f"p50 alone: {p50_alone * 1000:.1f} ms over {args.reps} requests")
    print(f"{args.clients} clients: {len(latencies)} requests in {elapsed:.1f} s = {rate:.3f} "
          f"requests/s, p50 {statistics.median(latencies) * 1000 if latencies else float('nan'):.1f} ms, "
          f"{len(errors)} errors")
    for e in errors[:5]:
        print(f"  error: {e}")
    print(f"forward passes per request (alone): {forwards:.1f}")
    if args.weights_bytes and args.bandwidth:
        floor = forwards * args.weights_bytes / args.bandwidth
        print(f"weight-bandwidth floor: {forwards:.1f} forwards x {args.weights_bytes / 1e9:.2f} GB "
              f"/ {args.bandwidth / 1e12:.2f} TB/s = {floor * 1000:.1f} ms per request; "
              f"p50 alone / floor = {p50_alone / floor:.1f}x" if floor > 0 else
              "weight-bandwidth floor: no forwards counted")
    return 1 if errors or not latencies else 0


if __name__ == "__main__":
    sys.exit(main())
