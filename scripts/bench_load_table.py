#!/usr/bin/env python3
"""The tables of scripts/bench-load.sh: per implementation, layout and activation dtype, the load
(time, resident memory added against the bytes on disk), the 1- and 2-layer prefill and decoder
times, one layer's share (their difference) and the 30-layer estimate (the 1-layer time minus one
layer, plus 30 layers), and Hunch's CPU times of the same; then the sampled memory (scripts/sample_anon.py): per checkpoint the
steady anonymous memory, its peaks above that during the load and the reads, and the largest
tensor. Reads the JSON lines accel-bench and mlx_vlm's ref_bench.py append, each tagged
IMPL:LAYOUT:DTYPE:LAYERS.

    python3 scripts/bench_load_table.py target/bench-load/results.jsonl
"""
import json
import sys
from collections import defaultdict

TARGET_LAYERS = 30


def main(path):
    runs = defaultdict(dict)  # (impl, layout, dtype) -> layers -> {event: record}
    machine = None
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        record = json.loads(line)
        tag = record.get("tag", "")
        parts = tag.split(":")
        if len(parts) != 4:
            continue
        impl, layout, dtype, layers = parts[0], parts[1], parts[2], int(parts[3])
        events = runs[(impl, layout, dtype)].setdefault(layers, {})
        event = record.get("event")
        if event in ("prefill", "decode"):
            # One measurement of each is what bench-load.sh asks for; keep the first.
            events.setdefault(event, record)
        elif event in ("load", "env", "anon"):
            events[event] = record
            if event == "env" and machine is None:
                machine = record
    if machine:
        print(
            f"machine: {machine.get('cpu_count', '?')} CPUs, {machine.get('system', '?')} "
            f"{machine.get('machine', '?')}, BLAS {machine.get('blas_libs') or machine.get('blas')}"
        )
    head = (
        "| impl | layout | activations | disk (2 layers) | load | resident after load | "
        "resident added / disk | "
        "peak added / disk | prefill 1 / 2 layers | per layer | prefill, 30 layers | "
        "decoder 1 / 2 layers | per layer | decoder, 30 layers | CPU time: prefill, decoder, "
        "1 / 2 layers |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for (impl, layout, dtype), by_layers in sorted(runs.items()):
        one, two = by_layers.get(1, {}), by_layers.get(2, {})
        load = two.get("load", {})
        cells = [impl, layout, dtype]
        disk = load.get("disk_mb")
        cells.append(f"{disk / 1024:.2f} GB" if disk else "n/a")
        cells.append(f"{load['seconds']:.1f} s" if "seconds" in load else "n/a")
        # The whole process (for mlx_vlm the Python interpreter and its imports too).
        cells.append(f"{load['rss_mb'] / 1024:.2f} GB" if "rss_mb" in load else "n/a")
        for key in ("rss_added_vs_disk", "rss_peak_added_vs_disk"):
            cells.append(f"{load[key]:.3f}" if key in load else "n/a")
        for event in ("prefill", "decode"):
            t1 = one.get(event, {}).get("median_ms")
            t2 = two.get(event, {}).get("median_ms")
            if t1 is None or t2 is None:
                cells += ["n/a", "n/a", "n/a"]
                continue
            per_layer = t2 - t1
            fixed = t1 - per_layer
            estimate = fixed + TARGET_LAYERS * per_layer
            cells += [f"{t1:.0f} / {t2:.0f} ms", f"{per_layer:.0f} ms", f"{estimate / 1000:.1f} s"]
        # The process's CPU time (accel-bench's cpu_median_ms), which a shared machine does not
        # inflate the way it does wall time; mlx_vlm's harness does not report it.
        cpu = []
        for event in ("prefill", "decode"):
            c1 = one.get(event, {}).get("cpu_median_ms")
            c2 = two.get(event, {}).get("cpu_median_ms")
            cpu.append(f"{c1:.0f} / {c2:.0f} ms" if c1 is not None and c2 is not None else "n/a")
        cells.append(", ".join(cpu))
        print("| " + " | ".join(cells) + " |")
    memory_table(runs)


def memory_table(runs):
    """Sampled anonymous memory per checkpoint: what a machine must have free."""
    # (layout, layers) -> MiB, from Hunch's load event (the same checkpoint for both sides)
    largest, disks = {}, {}
    for (impl, layout, _), by_layers in runs.items():
        for layers, events in by_layers.items():
            load = events.get("load", {})
            if load.get("largest_tensor_mb"):
                largest[(layout, layers)] = load["largest_tensor_mb"]
            if load.get("disk_mb"):
                disks[(layout, layers)] = load["disk_mb"]
    print()
    head = (
        "| impl | layout | activations | layers | disk | largest tensor | steady (after load) | "
        "steady / disk | load peak above steady | read peak above steady | peaks / largest "
        "tensor | steady, 2 − 1 layers |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    gib = lambda mb: f"{mb / 1024:.2f} GiB"
    for (impl, layout, dtype), by_layers in sorted(runs.items()):
        for layers in sorted(by_layers):
            anon = by_layers[layers].get("anon")
            if not anon:
                continue
            disk = disks.get((layout, layers))
            big = largest.get((layout, layers))
            lp, rp = anon["load_peak_over_mb"], anon["read_peak_over_mb"]
            other = by_layers.get(3 - layers, {}).get("anon")
            diff = (anon["steady_mb"] - other["steady_mb"]) * (1 if layers == 2 else -1) if other else None
            print("| " + " | ".join([
                impl, layout, dtype, str(layers),
                gib(disk) if disk else "n/a",
                gib(big) if big else "n/a",
                gib(anon["steady_mb"]),
                f"{anon['steady_mb'] / disk:.2f}" if disk else "n/a",
                gib(lp), gib(rp),
                f"{lp / big:.2f} / {rp / big:.2f}" if big else "n/a",
                gib(diff) if diff is not None else "n/a",
            ]) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
