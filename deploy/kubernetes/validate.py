#!/usr/bin/env python3
"""Validates Hunch's Kubernetes manifests offline (run by scripts/validate-manifests.sh).

For the base and every overlay: render it (render.py; and with kustomize too where installed,
the two must agree), validate every built-in object strictly against the Kubernetes OpenAPI
schemas that the kubernetes-validate package bundles, validate the custom resources against the
schemas in schemas/, and check what docs/deploy.md promises of the pod (probes, read-only root,
drain timing, the GPU request, the gauges the endpoint picker and the autoscaler read).

Prints `manifests: N passed, N failed` and exits 1 when anything failed.
"""
import json
import pathlib
import shutil
import subprocess
import sys
import tomllib

import jsonschema
import kubernetes_validate
import yaml

from render import render

HERE = pathlib.Path(__file__).resolve().parent
KUBERNETES_VERSION = "1.33.0"
TARGETS = ["base", "overlays/cpu", "overlays/gpu", "overlays/gateway"]
CUSTOM = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json",
}
GAUGES = ["hunch_queued_requests", "hunch_running_requests", "hunch_prefix_cache_utilization"]

passed = 0
failed = 0


def check(what, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok: {what}")
    else:
        failed += 1
        print(f"FAILED: {what} {detail}", file=sys.stderr)


def key(doc):
    return (doc["apiVersion"], doc["kind"], doc["metadata"]["name"])


def kustomize(target):
    """The real kustomize's rendering, or None where none is installed."""
    if shutil.which("kustomize"):
        command = ["kustomize", "build", str(HERE / target)]
    elif shutil.which("kubectl"):
        command = ["kubectl", "kustomize", str(HERE / target)]
    else:
        return None
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs, kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found[0] if len(found) == 1 else None


def all_of(target, docs, what, wanted):
    """The one document of each (kind, name) in `wanted`; None, after failing the check that
    `target` has `what`, when any is missing."""
    found = [one(docs, kind, name) for kind, name in wanted]
    if any(d is None for d in found):
        check(f"{target}: has {what}", False)
        return None
    return found


def check_hunch_pod(target, docs, deployment, config):
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    check(f"{target}: the root file system is read-only",
          container["securityContext"].get("readOnlyRootFilesystem") is True)
    check(f"{target}: it runs as a non-root user",
          pod["securityContext"].get("runAsNonRoot") is True)
    check(f"{target}: readiness is /readyz (false while loading or draining)",
          container["readinessProbe"]["httpGet"]["path"] == "/readyz")
    startup = container["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    check(f"{target}: the startup probe allows a long model load ({budget} s >= 600)", budget >= 600)
    check(f"{target}: liveness is /healthz",
          container["livenessProbe"]["httpGet"]["path"] == "/healthz")
    settings = tomllib.loads(config["data"]["hunch.toml"])
    drain = settings.get("drain_delay", 0) + settings.get("shutdown_grace", 30)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    check(f"{target}: SIGKILL comes after drain_delay + shutdown_grace + 10 ({grace} >= {drain + 10})",
          grace >= drain + 10)
    check(f"{target}: the decision log is shipped to a collector",
          bool(settings.get("decision_log", {}).get("url")))
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    check(f"{target}: the cache, /tmp and the policies are mounted",
          {"/var/cache/hunch", "/tmp", "/etc/hunch/policies"} <= mounts)
    hpa = one(docs, "HorizontalPodAutoscaler", "hunch")
    metric = hpa and hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    check(f"{target}: the autoscaler reads the queue gauge ({metric})", metric == GAUGES[0])
    resources = container["resources"]
    if "gpu" in target:
        check(f"{target}: one nvidia.com/gpu per pod",
              resources["limits"].get("nvidia.com/gpu") == "1")
    else:
        check(f"{target}: no GPU requested", "nvidia.com/gpu" not in resources.get("limits", {}))


def check_gateway(target, docs, epp, pool):
    args = epp["spec"]["template"]["spec"]["containers"][0]["args"]
    for flag, gauge in zip(
        ["--total-queued-requests-metric", "--total-running-requests-metric",
         "--kv-cache-usage-percentage-metric"], GAUGES):
        check(f"{target}: the endpoint picker reads {gauge}", f"{flag}={gauge}" in args)
    hunch = one(docs, "Deployment", "hunch")
    labels = hunch["spec"]["template"]["metadata"]["labels"]
    selector = pool["spec"]["selector"]["matchLabels"]
    check(f"{target}: the pool selects the hunch pods",
          all(labels.get(k) == v for k, v in selector.items()))
    port = hunch["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    check(f"{target}: the pool targets their port",
          pool["spec"]["targetPorts"][0]["number"] == port)


def main():
    for target in TARGETS:
        docs = render(HERE / target)
        theirs = kustomize(target)
        if theirs is None:
            print(f"note: no kustomize installed; {target} rendered by render.py only")
        else:
            ours = {key(d): d for d in docs}
            real = {key(d): d for d in theirs}
            check(f"{target}: render.py and kustomize agree", ours == real,
                  str(sorted(set(ours) ^ set(real))))
        for doc in docs:
            name = f"{target}: {doc['kind']}/{doc['metadata']['name']}"
            schema = CUSTOM.get((doc["apiVersion"], doc["kind"]))
            try:
                if schema:
                    jsonschema.validate(doc, json.loads((HERE / "schemas" / schema).read_text()))
                else:
                    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
                check(f"{name} is valid", True)
            except (jsonschema.ValidationError, kubernetes_validate.ValidationError,
                    kubernetes_validate.SchemaNotFoundError,
                    kubernetes_validate.InvalidSchemaError) as e:
                check(f"{name} is valid", False, str(e).splitlines()[0])
        pod = all_of(target, docs, "the hunch Deployment and ConfigMap",
                     [("Deployment", "hunch"), ("ConfigMap", "hunch-config")])
        if pod:
            check_hunch_pod(target, docs, *pod)
        if "gateway" in target:
            gateway = all_of(target, docs, "the InferencePool and its endpoint picker",
                             [("Deployment", "hunch-epp"), ("InferencePool", "hunch")])
            if gateway:
                check_gateway(target, docs, *gateway)
    print(f"manifests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
