#!/usr/bin/env python3
"""Renders a kustomization of this directory without kustomize: the subset the manifests use.

    render.py DIR            prints the rendered YAML documents of DIR/kustomization.yaml

Supported, and refused otherwise: `resources` (YAML files, or directories holding a
kustomization) and `patches` with a JSON 6902 patch file (`path`) and a `target` (kind, name).
scripts/validate-manifests.sh renders every overlay with this and, where kustomize (or
`kubectl kustomize`) is installed, compares the two, so this stays honest.
"""
import copy
import pathlib
import sys

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "patches"}


class RenderError(Exception):
    pass


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def pointer(path):
    if not path.startswith("/"):
        raise RenderError(f"JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def parent_and_key(doc, path):
    parts = pointer(path)
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def apply_op(doc, op):
    kind, path = op["op"], op["path"]
    parent, key = parent_and_key(doc, path)
    value = copy.deepcopy(op.get("value"))
    if isinstance(parent, list):
        if kind == "add":
            if key == "-":
                parent.append(value)
            else:
                parent.insert(int(key), value)
        elif kind == "replace":
            parent[int(key)] = value
        elif kind == "remove":
            del parent[int(key)]
        else:
            raise RenderError(f"unsupported op {kind}")
    else:
        if kind in ("add", "replace"):
            if kind == "replace" and key not in parent:
                raise RenderError(f"replace of missing {path}")
            parent[key] = value
        elif kind == "remove":
            del parent[key]
        else:
            raise RenderError(f"unsupported op {kind}")


def render(directory):
    directory = pathlib.Path(directory)
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise RenderError(f"{directory}: fields this renderer does not know: {sorted(unknown)}")
    docs = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        docs.extend(render(path) if path.is_dir() else load_docs(path))
    for patch in kustomization.get("patches", []):
        target = patch.get("target", {})
        ops = load_docs(directory / patch["path"])[0]
        matched = [
            d for d in docs
            if d.get("kind") == target.get("kind") and d["metadata"].get("name") == target.get("name")
        ]
        if len(matched) != 1:
            raise RenderError(f"{directory}: patch {patch['path']} matches {len(matched)} resources")
        for op in ops:
            apply_op(matched[0], op)
    return docs


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: render.py DIR")
    try:
        docs = render(sys.argv[1])
    except (RenderError, KeyError, IndexError, ValueError) as e:
        sys.exit(f"render: {e}")
    print(yaml.safe_dump_all(docs, sort_keys=False), end="")


if __name__ == "__main__":
    main()
