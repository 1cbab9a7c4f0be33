"""Signed policy bundles for the fleet, built with the host's `hunch bundle build` (docs/deploy.md,
"Policy bundles"), and the policy version each revision must decide with."""

import hashlib
import os
import shutil
import time

from .harness import run


def sha16(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


class Bundles:
    """Builds signed bundles with the host's `hunch bundle build` and publishes them into the
    directory the bundle server serves (rename into place: a poll never sees half a file)."""

    def __init__(self, hunch, work, policy):
        self.hunch = hunch
        self.policy = policy
        self.work = work
        self.key = os.path.join(work, "signing", "bundle.pem")
        os.makedirs(os.path.dirname(self.key))
        run([hunch, "bundle", "keygen", "-o", self.key])
        shutil.copy(os.path.join(work, "signing", "bundle.pub.pem"),
                    os.path.join(work, "keys", "bundle.pub.pem"))
        self.versions = {}

    def publish(self, revision, wasm):
        """Builds `revision` holding `wasm` as the policy, signed, and renames it into place."""
        src = os.path.join(self.work, "src", revision)
        os.makedirs(src)
        shutil.copy(wasm, os.path.join(src, f"{self.policy}.wasm"))
        out = os.path.join(self.work, "built", f"{revision}.tar.gz")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        run([self.hunch, "bundle", "build", src, "-o", out, "--revision", revision,
             "--signing-key", self.key])
        self.versions[revision] = sha16(os.path.join(src, f"{self.policy}.wasm"))
        tmp = os.path.join(self.work, "bundles", ".policies.tar.gz.tmp")
        shutil.copy(out, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(self.work, "bundles", "policies.tar.gz"))
        return time.monotonic()

