#!/usr/bin/env python3
"""The fleet test (docs/deploy.md, "The fleet test"): three Hunch replicas behind HAProxy, a
bundle server and a decision-log collector (tests/fleet/compose.yml), a bounded client load
through the balancer, and four faults while it runs:

  kill       one replica killed (SIGKILL), another restarted (SIGTERM, drain, start): no client
             sees an error a retry could have avoided, no request that can never succeed sees a
             5xx (invalid requests are sent throughout and must get their 4xx);
  bundle     a new signed bundle revision published: every replica reports it in /v1/status
             (the time it took is printed; only convergence within a generous bound is asserted)
             and every decision names one revision, consistent with its policy version;
  partition  one replica cut off from the bundle server (`docker network disconnect`) while a
             further revision is published: it keeps serving its last good revision and reports
             itself stale; reconnected, it catches up;
  collector  the collector stopped for a while (and a replica killed and started again while it
             is down, holding events the collector has not taken), then started: decisions keep
             answering, and at the end every decision the clients were answered is at the
             collector (once, counted by decision id) or counted as dropped by a replica's
             /metrics.

It prints the figures (requests, statuses, retries, convergence, answered/collected/duplicates/
drops) and `N passed, N failed`, exits non-zero when a check failed, and removes everything it
started (`docker-compose down -v`) whatever happens. Standard library only.

  tests/fleet/fleet-test.py [--image hunch:latest] [--hunch target/debug/hunch]
                            [--faults kill,bundle,partition,collector] [--clients 3] [--rate 1]

Its parts are in tests/fleet/fleetlib/. tests/fleet/run.sh builds the tools image and runs this;
scripts/test.sh runs run.sh.
"""

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time

# The test's own package (tests/fleet/fleetlib/); no __pycache__ left in the tree.
sys.dont_write_bytecode = True
from fleetlib.bundles import Bundles, sha16  # noqa: E402
from fleetlib.fleet import Fleet  # noqa: E402
from fleetlib.harness import Checks, log, request, run, wait_for  # noqa: E402
from fleetlib.load import Load  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REPLICAS = ["replica1", "replica2", "replica3"]
POLICY = "probe"
WASM = {
    "v1": "policies/target/wasm32-wasip2/release/replay_probe.wasm",
    "v2": "policies/target/wasm32-wasip2/release/replay_probe_v2.wasm",
}
# Bounds on waiting for a state to be reached. They bound a hang, they are not measurements: the
# test asserts that the state is reached, and prints how long it took.
READY_BOUND = 300.0
CONVERGE_BOUND = 60.0
SETTLE_BOUND = 90.0
# The bundle poll and staleness the replicas run with (fast, so the test is short).
BUNDLE_POLL = "2s"
BUNDLE_STALE_AFTER = "6s"


# --- The test ---------------------------------------------------------------------------------

class FleetTest:
    def __init__(self, args, checks, work):
        self.args = args
        self.checks = checks
        self.work = work
        self.faults = set(args.faults.split(","))
        self.use_bundles = bool(self.faults & {"bundle", "partition"})
        self.fleet = Fleet(args.project, work, args.image, args.tools_image)
        self.bundles = None
        self.load = None
        self.figures = {}
        # Counted drops per (replica, container start): a restarted process counts from 0.
        self.drops = {}

    # Each replica's drops, remembered per process, so a restart does not forget them.
    def scrape_drops(self):
        for r in REPLICAS:
            try:
                started = self.fleet.started_at(r)
                self.drops[(r, started)] = self.fleet.http_drops(r)
            except (OSError, http.client.HTTPException, RuntimeError, ValueError):
                pass

    def prepare(self):
        for d in ("keys", "policies", "bundles"):
            os.makedirs(os.path.join(self.work, d))
        env = [
            # Unready at once on SIGTERM, still answering for 4 s while the balancer's health
            # check (two failures, 1 s apart) takes the replica out (docs/deploy.md, "Draining").
            "HUNCH_DRAIN_DELAY=4",
            "HUNCH_SHUTDOWN_GRACE=20",
            "HUNCH_DECISION_LOG_URL=http://collector:8686/",
            # The durable spool: events survive a kill and are sent again after the restart.
            "HUNCH_DECISION_LOG_SPOOL=/var/lib/hunch/spool",
            # The random DiffusionGemma demo, not the image's default chat model: this test is
            # about the fleet (kills, bundles, partitions, the collector), and three replicas of
            # the real model on a 2-core CI machine take ~15 s a decision, so a short fault phase
            # could pass without one request sent in it (docs/deploy.md, "The fleet test").
            "HUNCH_DEMO=1",
        ]
        if self.use_bundles:
            self.bundles = Bundles(self.args.hunch, self.work, POLICY)
            env += [
                "HUNCH_BUNDLE_URL=http://bundles/policies.tar.gz",
                "HUNCH_BUNDLE_PUBLIC_KEY=/etc/hunch/keys/bundle.pub.pem",
                f"HUNCH_BUNDLE_POLL={BUNDLE_POLL}",
                f"HUNCH_BUNDLE_STALE_AFTER={BUNDLE_STALE_AFTER}",
            ]
            self.bundles.publish("r1", os.path.join(ROOT, WASM["v1"]))
        else:
            # Without bundles the policy comes from the image's watched policy directory.
            shutil.copy(os.path.join(ROOT, WASM["v1"]),
                        os.path.join(self.work, "policies", f"{POLICY}.wasm"))
        with open(os.path.join(self.work, "replica.env"), "w") as f:
            f.write("\n".join(env) + "\n")
        # The replicas run as uid 10001 and read the mounted files.
        for dirpath, dirnames, filenames in os.walk(self.work):
            if os.path.basename(dirpath) == "signing":
                continue
            os.chmod(dirpath, 0o755)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o644)
        os.chmod(self.work, 0o755)

    def start_fleet(self):
        started = time.monotonic()
        self.fleet.compose("up", "-d", "--no-build", timeout=300)

        def all_ready():
            if not all(self.fleet.ready(r) for r in REPLICAS):
                return False
            servers = self.fleet.balancer_servers()
            if not all(servers.get(r, {}).get("status") == "UP" for r in REPLICAS):
                return False
            if self.use_bundles:
                return all((self.fleet.status(r).get("bundle") or {}).get("revision") == "r1"
                           for r in REPLICAS)
            return True

        ok, _ = wait_for("the fleet to be ready", all_ready, READY_BOUND, interval=1.0)
        self.figures["fleet ready (s)"] = round(time.monotonic() - started, 1)
        self.checks.check(
            f"three replicas ready and UP in the balancer"
            + (" on bundle revision r1" if self.use_bundles else "")
            + f" ({self.figures['fleet ready (s)']} s)", bool(ok))
        if not ok:
            raise RuntimeError("the fleet did not become ready")
        self.scrape_drops()

    def steady(self, seconds):
        """Lets the load run, scraping drop counters every 2 s."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.scrape_drops()
            time.sleep(min(2.0, max(0.0, end - time.monotonic())))

    def wait_all_up(self, what):
        def up():
            servers = self.fleet.balancer_servers()
            return all(servers.get(r, {}).get("status") == "UP" for r in REPLICAS) and all(
                self.fleet.ready(r) for r in REPLICAS)
        ok, took = wait_for(what, up, READY_BOUND, interval=0.5)
        return bool(ok), took

    # -- fault 1 --------------------------------------------------------------------------------
    def fault_kill(self):
        self.load.phase = "kill"
        log("fault: docker kill replica1, docker restart replica2")
        self.scrape_drops()
        run(["docker", "kill", self.fleet.container("replica1")])
        self.steady(4)
        self.scrape_drops()
        run(["docker", "restart", "-t", "40", self.fleet.container("replica2")], timeout=120)
        self.fleet.forget_ports("replica2")
        self.steady(4)
        log("fault: docker start replica1 (its volumes, its spool, its bundle as they were)")
        run(["docker", "start", self.fleet.container("replica1")])
        self.fleet.forget_ports("replica1")
        ok, took = self.wait_all_up("replica1 and replica2 back in the balancer")
        self.figures["back in the balancer after kill/restart (s)"] = round(took, 1)
        self.checks.check(f"the killed and the restarted replica serve again ({took:.1f} s)", ok)
        self.steady(3)

    # -- fault 2 --------------------------------------------------------------------------------
    def converge(self, revision, replicas, published):
        """Seconds from publication until each replica reports `revision` (None: never)."""
        seen = {}

        def all_there():
            for r in replicas:
                if r not in seen and (self.fleet.status(r).get("bundle") or {}).get(
                        "revision") == revision:
                    seen[r] = time.monotonic() - published
            return len(seen) == len(replicas)

        wait_for(f"every replica on {revision}", all_there, CONVERGE_BOUND, interval=0.2)
        return seen

    def fault_bundle(self):
        self.load.phase = "bundle"
        log("fault: publish bundle revision r2 (the policy's version 2)")
        published = self.bundles.publish("r2", os.path.join(ROOT, WASM["v2"]))
        seen = self.converge("r2", REPLICAS, published)
        worst = max(seen.values()) if len(seen) == len(REPLICAS) else None
        self.figures["r2 on every replica (s)"] = round(worst, 1) if worst is not None else None
        self.figures["r2 per replica (s)"] = {r: round(s, 1) for r, s in sorted(seen.items())}
        self.checks.check(
            f"every replica reports revision r2 within {CONVERGE_BOUND:.0f} s of its publication"
            f" (took {worst if worst is None else round(worst, 1)} s)", worst is not None,
            f"seen: {seen}")
        self.steady(4)

    # -- fault 3 --------------------------------------------------------------------------------
    def fault_partition(self):
        self.load.phase = "partition"
        cut = "replica3"
        network = f"{self.fleet.project}_bundles"
        before = (self.fleet.status(cut)["bundle"] or {}).get("revision")
        log(f"fault: docker network disconnect {network} {cut}; publish r3")
        run(["docker", "network", "disconnect", network, self.fleet.container(cut)])
        disconnected = time.monotonic()
        published = self.bundles.publish("r3", os.path.join(ROOT, WASM["v1"]))
        others = [r for r in REPLICAS if r != cut]
        seen = self.converge("r3", others, published)
        self.checks.check("the replicas still connected take r3", len(seen) == len(others),
                          f"seen: {seen}")

        def stale():
            b = self.fleet.status(cut)["bundle"] or {}
            return b if b.get("stale") is True else None

        status, _ = wait_for(f"{cut} to report itself stale", stale, CONVERGE_BOUND)
        status = status or (self.fleet.status(cut)["bundle"] or {})
        self.figures["cut-off replica reports stale after (s)"] = round(
            time.monotonic() - disconnected, 1)
        self.figures["r3 on the connected replicas (s)"] = (
            round(max(seen.values()), 1) if seen else None)
        self.checks.check(
            f"{cut}, cut off from the bundle server, reports itself stale (stale_seconds="
            f"{status.get('stale_seconds')}) and keeps its last good revision {before}",
            status.get("stale") is True and status.get("revision") == before, json.dumps(status))
        # It still decides, on the revision it has.
        code, headers, body = request("POST", self.fleet.address(cut), f"/v1/policies/{POLICY}",
                                   body=b'{"id": 1, "message": "still there?"}',
                                   headers={"content-type": "application/json"})
        answered = json.loads(body) if code == 200 else {}
        self.checks.check(
            f"{cut} still decides while cut off, on {before} (status {code}, revision "
            f"{headers.get('x-hunch-bundle-revision')})",
            code == 200 and headers.get("x-hunch-bundle-revision") == before
            and answered.get("version") == self.bundles.versions.get(before))
        if code == 200:
            # A decision the clients did not make, but which the collector gets: counted apart.
            self.direct_ids.add(answered.get("decision_id"))
        self.steady(2)
        log(f"fault: docker network connect {network} {cut}")
        reconnected = time.monotonic()
        run(["docker", "network", "connect", network, self.fleet.container(cut)])

        def caught_up():
            b = self.fleet.status(cut)["bundle"] or {}
            return b.get("revision") == "r3" and b.get("stale") is False

        ok, took = wait_for(f"{cut} to catch up", caught_up, CONVERGE_BOUND, interval=0.2)
        self.figures["reconnected replica on r3 after (s)"] = round(
            time.monotonic() - reconnected, 1)
        self.checks.check(f"{cut}, reconnected, catches up to r3 and is no longer stale "
                          f"({self.figures['reconnected replica on r3 after (s)']} s)", bool(ok))
        self.steady(3)

    # -- fault 4 --------------------------------------------------------------------------------
    def fault_collector(self):
        self.load.phase = "collector"
        log("fault: docker stop collector")
        run(["docker", "stop", "-t", "10", self.fleet.container("collector")])
        self.steady(6)
        # A replica that dies while it holds events the collector has not taken: what it held
        # must not be lost uncounted (the spool keeps it on disk; it is sent after the restart).
        log("fault: docker kill replica3 while the collector is down, then start it")
        self.scrape_drops()
        run(["docker", "kill", self.fleet.container("replica3")])
        self.steady(2)
        run(["docker", "start", self.fleet.container("replica3")])
        self.fleet.forget_ports("replica3")
        ok, took = self.wait_all_up("replica3 back in the balancer")
        self.checks.check(f"replica3, killed while the collector was down, serves again "
                          f"({took:.1f} s)", ok)
        self.steady(4)
        log("fault: docker start collector")
        run(["docker", "start", self.fleet.container("collector")])
        self.fleet.forget_ports("collector")
        log("fault: collector started again")
        self.load.phase = "after"
        self.steady(4)

    # -- the end --------------------------------------------------------------------------------
    def collected(self):
        _, _, body = request("GET", self.fleet.address("collector", 8686), "/events", timeout=30)
        return [json.loads(line) for line in body.decode().splitlines() if line.strip()]

    def settle(self, answered):
        """Waits until every decision the clients saw is collected or counted as dropped."""
        last = {"state": None, "since": time.monotonic()}

        def done():
            self.scrape_drops()
            ids = {e["decision_id"] for e in self.collected()}
            missing = len(answered - ids)
            drops = sum(self.drops.values())
            if missing == 0 or missing == drops:
                return True
            # Nothing moved for 20 s (the sink's retries are over): what is missing stays so.
            if (missing, drops, len(ids)) != last["state"]:
                last["state"], last["since"] = (missing, drops, len(ids)), time.monotonic()
            if time.monotonic() - last["since"] > 20:
                raise TimeoutError(f"{missing} decisions missing, {drops} drops, for 20 s")
            return False

        ok, took = wait_for("the decision log to settle", done, SETTLE_BOUND, interval=1.0)
        self.figures["decision log settled after (s)"] = round(took, 1)
        # Once more, after the last batch: the counters can only have grown.
        time.sleep(2)
        self.scrape_drops()

    def verify(self):
        results = self.load.results
        valid = [r for r in results if r["kind"] == "valid"]
        invalid = [r for r in results if r["kind"] != "valid"]
        statuses = {}
        for r in results:
            key = str(r["status"]) if r["status"] is not None else "no answer"
            statuses[key] = statuses.get(key, 0) + 1
        per_replica = {}
        for r in results:
            if r["replica"]:
                per_replica[r["replica"]] = per_replica.get(r["replica"], 0) + 1
        self.figures["requests"] = len(results)
        self.figures["valid / invalid requests"] = f"{len(valid)} / {len(invalid)}"
        self.figures["statuses"] = dict(sorted(statuses.items()))
        self.figures["answered by"] = dict(sorted(per_replica.items()))
        rows = self.fleet.balancer_servers()
        backend = rows.get("BACKEND", {})
        self.figures["balancer retries / redispatches"] = (
            f"{backend.get('wretr')} / {backend.get('wredis')}")
        self.figures["balancer 5xx to clients"] = backend.get("hrsp_5xx")

        failed = [r for r in valid if r["status"] != 200]
        self.checks.check(
            f"every valid decision was answered 200 through the faults ({len(valid)} requests, "
            f"{len(failed)} not 200)", not failed,
            "\n  ".join(json.dumps(r) for r in failed[:10]))
        wrong = [r for r in invalid if r["status"] not in r["expect"]]
        self.checks.check(
            f"every request that can never succeed got its 4xx, never a 5xx ({len(invalid)} "
            f"requests)", not wrong, "\n  ".join(json.dumps(r) for r in wrong[:10]))
        self.checks.check("the load ran through every phase",
                          all(any(r["phase"] == p for r in valid) for p in self.phases()))

        ok200 = [r for r in valid if r["status"] == 200]
        if self.use_bundles:
            versions = self.bundles.versions
            mixed = [r for r in ok200 if r["revision"] not in versions
                     or versions[r["revision"]] != r["version"]]
            self.checks.check(
                "every answered decision names one bundle revision, and its policy version is "
                "that revision's", not mixed and bool(ok200),
                "\n  ".join(json.dumps(r) for r in mixed[:10]))
            by_revision = {}
            for r in ok200:
                by_revision[r["revision"]] = by_revision.get(r["revision"], 0) + 1
            self.figures["decisions per revision"] = dict(sorted(by_revision.items()))
        else:
            version = sha16(os.path.join(ROOT, WASM["v1"]))
            self.checks.check("every answered decision ran the policy's version",
                              all(r["version"] == version for r in ok200))

        # The decision log: every decision the clients were answered (with a decision id, 200 or
        # not) is at the collector, or counted as dropped by the replica that made it.
        answered = {r["decision_id"] for r in results if r["decision_id"]}
        answered200 = {r["decision_id"] for r in ok200 if r["decision_id"]}
        self.checks.check("every 200 carried its decision id",
                          len(answered200) == len(ok200), f"{len(ok200) - len(answered200)} without")
        self.settle(answered)
        events = self.collected()
        ids = {e["decision_id"] for e in events}
        _, _, body = request("GET", self.fleet.address("collector", 8686), "/stats", timeout=5)
        stats = json.loads(body)
        drops = sum(self.drops.values())
        missing = answered - ids
        extra = ids - answered - self.direct_ids
        self.figures["answered decisions (200 / all with an id)"] = (
            f"{len(answered200)} / {len(answered)}")
        self.figures["collector raw / distinct / duplicates"] = (
            f"{stats['raw']} / {stats['distinct']} / {stats['duplicates']}")
        self.figures["answered and collected"] = len(answered & ids)
        self.figures["counted drops (sum over replicas and restarts)"] = drops
        per_replica_drops = {}
        for (replica, _), n in self.drops.items():
            per_replica_drops[replica] = per_replica_drops.get(replica, 0) + n
        self.figures["counted drops by replica"] = dict(sorted(per_replica_drops.items()))
        self.figures["collected but never answered (lost to a kill, retried)"] = len(extra)
        by_replica = {}
        for r in results:
            if r["decision_id"] in missing:
                by_replica[r["replica"]] = by_replica.get(r["replica"], 0) + 1
        self.figures["answered but not collected, by replica"] = dict(sorted(by_replica.items()))
        self.checks.check(
            f"answered = collected + counted drops: {len(answered)} = {len(answered & ids)} + "
            f"{drops}", len(answered) == len(answered & ids) + drops,
            f"missing from the collector: {sorted(missing)[:10]}")
        self.checks.check("every answered-200 decision is collected or counted as dropped",
                          len(answered200 - ids) <= drops)

        if self.use_bundles:
            by_id = {r["decision_id"]: r for r in ok200}
            inconsistent = []
            for e in events:
                if (e.get("policy") or {}).get("name") != POLICY:
                    continue
                rev = e.get("bundle_revision")
                version = (e.get("policy") or {}).get("version")
                answer = by_id.get(e["decision_id"])
                if self.bundles.versions.get(rev) != version or (
                        answer is not None and answer["revision"] != rev):
                    inconsistent.append({"decision_id": e["decision_id"], "event_revision": rev,
                                         "event_version": version,
                                         "answered_revision": answer and answer["revision"]})
            self.checks.check(
                "every collected event names the bundle revision its response named, with that "
                "revision's policy version", not inconsistent,
                "\n  ".join(json.dumps(i) for i in inconsistent[:10]))

    def phases(self):
        order = [("kill", "kill"), ("bundle", "bundle"), ("partition", "partition"),
                 ("collector", "collector")]
        return ["start"] + [p for f, p in order if f in self.faults] + ["after"]

    def run(self):
        self.direct_ids = set()
        self.prepare()
        self.start_fleet()
        self.load = Load(self.fleet.address("balancer"), POLICY, self.args.clients, self.args.rate)
        started = time.monotonic()
        self.load.start()
        self.steady(5)
        if "kill" in self.faults:
            self.fault_kill()
        if "bundle" in self.faults:
            self.fault_bundle()
        if "partition" in self.faults:
            self.fault_partition()
        if "collector" in self.faults:
            self.fault_collector()
        self.load.phase = "after"
        self.steady(3)
        self.load.finish()
        self.figures["load ran (s)"] = round(time.monotonic() - started, 1)
        self.verify()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default="hunch:latest")
    parser.add_argument("--tools-image", default="hunch-fleet-tools")
    parser.add_argument("--hunch", default=os.path.join(ROOT, "target", "debug", "hunch"),
                        help="the host's hunch binary, for `hunch bundle build`")
    parser.add_argument("--faults", default="kill,bundle,partition,collector")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1.0, help="requests/s per client")
    parser.add_argument("--project", default=f"hunchfleet{os.getpid()}{random.randrange(1000)}")
    parser.add_argument("--keep", action="store_true", help="leave the fleet running (debugging)")
    args = parser.parse_args()
    unknown = set(args.faults.split(",")) - {"kill", "bundle", "partition", "collector"}
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    if "partition" in args.faults and "bundle" not in args.faults:
        parser.error("partition needs bundle (it publishes r3 after r2)")
    for rel in WASM.values():
        if not os.path.exists(os.path.join(ROOT, rel)):
            sys.exit(f"fleet: {rel} is not built (cargo build --manifest-path policies/Cargo.toml"
                     " --target wasm32-wasip2 --release)")

    # SIGTERM (CI cancelling) tears the fleet down like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    checks = Checks()
    work = tempfile.mkdtemp(prefix="hunch-fleet.")
    test = FleetTest(args, checks, work)
    began = time.monotonic()
    log(f"project {args.project}, image {args.image}, faults {args.faults}, work {work}")
    try:
        test.run()
    except Exception as e:  # noqa: BLE001 - reported as a failed check, then torn down
        checks.check(f"the test ran to its end ({type(e).__name__}: {e})", False)
    except KeyboardInterrupt:
        checks.check("the test ran to its end (interrupted)", False)
    finally:
        if test.load is not None:
            test.load.stop.set()
        if checks.failed:
            try:
                print(test.fleet.logs(), file=sys.stderr)
            except Exception:  # noqa: BLE001 - the logs are a courtesy
                pass
        if not args.keep:
            test.fleet.compose("down", "-v", "--remove-orphans", "-t", "5", check=False,
                               timeout=180)
            shutil.rmtree(work, ignore_errors=True)
    test.figures["test ran (s)"] = round(time.monotonic() - began, 1)
    print("fleet: figures")
    for name, value in test.figures.items():
        print(f"  {name}: {value}")
    print(f"fleet: {checks.passed} passed, {checks.failed} failed")
    sys.exit(1 if checks.failed else 0)


if __name__ == "__main__":
    main()
