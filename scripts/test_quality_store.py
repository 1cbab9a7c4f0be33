"""Unit tests of scripts/quality_store.py, where scripts/quality.py keeps its reports
(docs/quality.md, "Where reports live"): the key the server computes too, the quality
directory's rule, the fingerprint a run is stored under, and a store that never overwrites.
Standard library only:

    python3 scripts/test_quality_store.py
"""

import json
import os
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality_store as quality  # noqa: E402


class Key(unittest.TestCase):
    def test_the_key_is_the_one_the_server_computes(self):
        # The same pairs are in host/src/quality/mod.rs `the_key_is_the_one_the_script_computes`.
        self.assertEqual(
            quality.report_key("5e1f0c2a9b7d4e38/llama-gguf-as-stored/mlx-cpu/openblas/float32/avx2/"
                               "logits-v1/chunk64/prompt4096"),
            "78fa2605bffd82dfbe717329e1f3c069")
        self.assertEqual(quality.report_key("modèle/ü"), "5d9df56997802c70cd6cae42513bbbde")


class Directory(unittest.TestCase):
    def dir_with(self, env, given=None):
        with mock.patch.dict(os.environ, env, clear=True):
            return quality.quality_dir(given)

    def test_beside_the_models_cache_unless_set(self):
        self.assertEqual(self.dir_with({"HOME": "/home/u"}), Path("/home/u/.cache/hunch/quality"))
        self.assertEqual(self.dir_with({"HOME": "/home/u", "HUNCH_MODELS_CACHE": "/srv/models"}),
                         Path("/srv/quality"))
        self.assertEqual(self.dir_with({"HOME": "/h", "HUNCH_QUALITY_DIR": "/q"}), Path("/q"))
        self.assertEqual(self.dir_with({"HUNCH_QUALITY_DIR": "/q"}, given="/flag"), Path("/flag"))
        self.assertEqual(self.dir_with({"HOME": "/h", "HUNCH_QUALITY_DIR": " "}), Path("/h/.cache/hunch/quality"))
        self.assertIsNone(self.dir_with({}))


class Store(unittest.TestCase):
    def doc(self, **extra):
        return {"model": "m", "fingerprint": "fp/1", "measured_at": "2026-12-07T01:02:03Z",
                "command": "scripts/quality.sh", **extra}

    def test_a_report_goes_under_its_key_and_never_over_another(self):
        with tempfile.TemporaryDirectory() as d:
            first = quality.store_report(self.doc(score=1), Path(d))
            second = quality.store_report(self.doc(score=2), Path(d))
            folder = Path(d) / quality.report_key("fp/1")
            self.assertEqual(first, folder / "20261207T010203Z.json")
            self.assertEqual(second, folder / "20261207T010203Z-1.json")
            self.assertEqual(json.loads(first.read_text())["score"], 1)
            self.assertEqual(json.loads(second.read_text())["score"], 2)
            # No temporary file is left behind.
            self.assertEqual(sorted(p.name for p in folder.iterdir()),
                             ["20261207T010203Z-1.json", "20261207T010203Z.json"])

    def test_the_fingerprint_is_the_listed_models_and_nan_never_reaches_json(self):
        listing = {"models": [{"name": "jev-latest", "x_fingerprint": "fp/1"},
                              {"name": "m", "x_fingerprint": "fp/1"}, {"name": "n", "x_fingerprint": None}]}
        self.assertEqual(quality.model_fingerprint(listing, "m"), "fp/1")
        self.assertIsNone(quality.model_fingerprint(listing, "n"))
        self.assertIsNone(quality.model_fingerprint(listing, "absent"))
        self.assertEqual(quality.finite({"a": [float("nan"), 1.5], "b": float("inf")}),
                         {"a": [None, 1.5], "b": None})

    def test_a_run_is_stored_under_its_fingerprint_only_when_it_is_known_and_stayed(self):
        listing = lambda fp: {"models": [{"name": "m", "x_fingerprint": fp}]}  # noqa: E731
        self.assertEqual(quality.measured_fingerprint("m", listing("a"), listing("a")), ("a", None))
        # Not loaded at the start (a models-directory model): known after the run.
        self.assertEqual(quality.measured_fingerprint("m", listing(None), listing("a")), ("a", None))
        for before, after in [(listing("a"), listing("b")), (listing("a"), listing(None)),
                              (listing("a"), None)]:
            fp, why = quality.measured_fingerprint("m", before, after)
            self.assertIsNone(fp)
            self.assertTrue(why.startswith("not stored: "), why)


if __name__ == "__main__":
    unittest.main()
