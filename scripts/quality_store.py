"""Where scripts/quality.py keeps its reports for `hunch serve` (docs/quality.md, "Where reports
live"): the quality directory, the key of a model's fingerprint (the server computes the same:
host/src/quality/mod.rs), and a store that is atomic and never overwrites. Standard library
only; scripts/test_quality_store.py tests it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path


class StoreError(Exception):
    """A report that cannot be stored (an unwritable directory): its message says where."""


def quality_dir(given: str | None = None) -> Path | None:
    """The quality directory: `given` (--quality-dir), else $HUNCH_QUALITY_DIR, else `quality/`
    beside the models cache ($HUNCH_MODELS_CACHE, else $HOME/.cache/hunch/models): the rule
    `hunch serve --quality-dir` defaults by (host/src/quality/mod.rs `default_dir`). None when
    there is no HOME either. A blank value counts as unset."""
    for v in (given, os.environ.get("HUNCH_QUALITY_DIR")):
        if v and v.strip():
            return Path(v.strip())
    cache = os.environ.get("HUNCH_MODELS_CACHE", "")
    if not cache.strip():
        home = os.environ.get("HOME", "")
        if not home.strip():
            return None
        cache = os.path.join(home, ".cache/hunch/models")
    return Path(cache).parent / "quality"


def report_key(fingerprint: str) -> str:
    """The folder of a fingerprint's reports: the first 32 hex digits of the SHA-256 of its UTF-8
    bytes, as the server computes it (host/src/quality/mod.rs `key`; both test suites check the
    same pairs)."""
    return hashlib.sha256(fingerprint.encode("utf-8")).hexdigest()[:32]


def model_fingerprint(models: dict, name: str) -> str | None:
    """The `x_fingerprint` GET /v1/models lists for model `name`; None when unknown (null, or
    the model is not listed)."""
    for m in models.get("models", []):
        if m.get("name") == name:
            fp = m.get("x_fingerprint")
            return fp if isinstance(fp, str) and fp else None
    return None


def finite(value):
    """`value` with every NaN or infinity replaced by None: JSON has neither, and the server
    (serde_json) would skip a report that holds one."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def store_report(doc: dict, directory: Path) -> Path:
    """Writes `doc` as DIR/KEY/MEASURED_AT.json (KEY: `report_key` of its fingerprint;
    MEASURED_AT compact, 20261207T012640Z) and returns the path. Atomic and never over an older
    report: the bytes go to a hidden temporary file in the same folder (the server reads no
    hidden file), which is then hard-linked to the first free name (`-1`, `-2`, … after the time
    when a report of the same second exists); a link never replaces a file."""
    folder = directory / report_key(doc["fingerprint"])
    folder.mkdir(parents=True, exist_ok=True)
    stem = doc["measured_at"].replace("-", "").replace(":", "")
    data = (json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        for n in range(1000):
            target = folder / (f"{stem}.json" if n == 0 else f"{stem}-{n}.json")
            try:
                os.link(tmp, target)
                return target
            except FileExistsError:
                continue
        raise StoreError(f"{folder} already holds 1,000 reports measured at {doc['measured_at']}")
    except OSError as e:
        raise StoreError(f"cannot store the report in {folder}: {e}") from e
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def measured_fingerprint(model: str, before: dict, after: dict | None) -> tuple[str | None, str | None]:
    """The fingerprint of the model just measured, from `after` (GET /v1/models after the run;
    None when it failed), and why the report cannot be stored when it cannot: a fingerprint that
    is unknown, or one that changed since `before` (the listing from the start of the run: the
    model was reloaded from another file, so the figures describe neither)."""
    if after is None:
        return None, "not stored: GET /v1/models failed after the run, so the model's fingerprint is unknown"
    fp = model_fingerprint(after, model)
    started = model_fingerprint(before, model)
    if fp is None:
        return None, (f"not stored: the server reports no fingerprint for {model} (x_fingerprint is "
                      "null), so the report cannot be matched to the file it measured")
    if started is not None and started != fp:
        return None, (f"not stored: {model}'s fingerprint changed during the run ({started} -> {fp}): "
                      "it was reloaded from another file")
    return fp, None


def keep_report(doc: dict, given_dir: str | None) -> str:
    """Stores `doc` (which has its fingerprint) in the quality directory; says where."""
    where = quality_dir(given_dir)
    if where is None:
        return "not stored: no quality directory (set HUNCH_QUALITY_DIR or --quality-dir, or HOME)"
    path = store_report(doc, where)
    return f"stored {path} (GET /v1/models/{doc['model']}/quality serves it)"
