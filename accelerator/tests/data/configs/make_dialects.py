#!/usr/bin/env python3
"""Writes the transformers-5 dialect of each published config in `v4/` into `v5/`.

The `v4/*.json` files are the `config.json` of published checkpoints as their repositories hold
them (transformers 4.x spelling: top-level `rope_theta`, `rope_scaling`, Gemma 3's
`rope_local_base_freq` and `sliding_window_pattern`), written out by hand from those
repositories. `v5/` is what transformers 5 itself writes for the same models: each config loaded
with `AutoConfig.from_pretrained` and saved again with `save_pretrained` (no model weights or
torch needed), which gives `rope_parameters` (one dict, or one per layer type), `layer_types`,
`dtype`, and the class defaults it fills in.

`tests/configs.rs` checks that both dialects of one model read to the same configuration.

Run from the repository root (transformers 5.x; the chat-reference venv has it):
    .venv-chatref/bin/python accelerator/tests/data/configs/make_dialects.py
"""

import json
import shutil
import tempfile
from pathlib import Path

import transformers
from transformers import AutoConfig

HERE = Path(__file__).resolve().parent


def main():
    (HERE / "v5").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted((HERE / "v4").glob("*.json")):
            src = Path(tmp) / path.stem
            src.mkdir()
            shutil.copy(path, src / "config.json")
            config = AutoConfig.from_pretrained(src)
            out = Path(tmp) / (path.stem + "-v5")
            config.save_pretrained(out)
            saved = json.loads((out / "config.json").read_text())
            (HERE / "v5" / path.name).write_text(json.dumps(saved, indent=2) + "\n")
            print("wrote", path.name, "with transformers", transformers.__version__)


if __name__ == "__main__":
    main()
