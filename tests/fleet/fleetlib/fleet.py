"""The fleet on Docker Compose (tests/fleet/compose.yml): its containers, the ports the engine
published for them, and what the test reads from the replicas and the balancer."""

import json
import os

from .harness import request, run

COMPOSE_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "compose.yml")


class Fleet:
    def __init__(self, project, work, image, tools_image):
        self.project = project
        self.work = work
        self.env = dict(os.environ, FLEET_WORK=work, HUNCH_IMAGE=image,
                        FLEET_TOOLS_IMAGE=tools_image, COMPOSE_PROJECT_NAME=project)
        self.ports = {}

    def compose(self, *args, check=True, capture=True, timeout=600):
        cmd = ["docker-compose", "-p", self.project, "-f", COMPOSE_FILE]
        return run(cmd + list(args), check=check, env=self.env, capture=capture, timeout=timeout)

    def container(self, service):
        out = self.compose("ps", "-q", service).stdout.strip()
        if not out:
            raise RuntimeError(f"no container for {service}")
        return out.splitlines()[0]

    def address(self, service, port=8080):
        """(host, port) where the engine published service's port; re-read after a restart."""
        key = (service, port)
        if key not in self.ports:
            out = run(["docker", "port", self.container(service), f"{port}/tcp"]).stdout
            line = out.strip().splitlines()[0]
            host, _, published = line.rpartition(":")
            self.ports[key] = ("127.0.0.1" if host in ("0.0.0.0", "") else host, int(published))
        return self.ports[key]

    def forget_ports(self, service):
        self.ports = {k: v for k, v in self.ports.items() if k[0] != service}

    def started_at(self, service):
        return run(["docker", "inspect", "-f", "{{.State.StartedAt}}",
                    self.container(service)]).stdout.strip()

    def get_json(self, service, path, port=8080):
        status, _, body = request("GET", self.address(service, port), path, timeout=5)
        if status != 200:
            raise RuntimeError(f"{service}{path} answered {status}")
        return json.loads(body)

    def ready(self, service):
        status, _, _ = request("GET", self.address(service), "/readyz", timeout=3)
        return status == 200

    def status(self, service):
        return self.get_json(service, "/v1/status")

    def http_drops(self, service):
        """hunch_decision_events_dropped_total of the HTTP sink, summed over causes."""
        _, _, body = request("GET", self.address(service), "/metrics", timeout=5)
        total = 0
        for line in body.decode().splitlines():
            if line.startswith("hunch_decision_events_dropped_total{") and 'sink="http"' in line:
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    def balancer_servers(self):
        """HAProxy's CSV stats: {server: row} for the `hunch` backend, `BACKEND` included."""
        _, _, body = request("GET", self.address("balancer", 8404), "/stats;csv", timeout=5)
        lines = body.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row.get("pxname") == "hunch":
                rows[row["svname"]] = row
        return rows

    def logs(self, tail=400):
        """The services' recent logs, without the probes' and the test's polling lines."""
        out = self.compose("logs", "--no-color", f"--tail={tail}", check=False)
        polls = ("route=/readyz", "route=/metrics", "route=/v1/status")
        return "".join(line for line in (out.stdout + out.stderr).splitlines(keepends=True)
                       if not any(p in line for p in polls))

