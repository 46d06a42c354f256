"""Checks of deploy/ that no off-the-shelf validator makes, run by deploy/validate.sh in its venv
(PyYAML from kubernetes-validate, dockerfile-parse):

- the Dockerfile: the runtime stage copies the binary from the path the build stage's
  `cargo build --release` writes, exposes 10912/10920/10921, runs as a non-root user, declares
  the data dir as a volume, health-checks with `hasync health`, copies only files that exist;
- the Kubernetes manifests: ports, native gRPC probes (readiness on hasync.v1.Replication,
  liveness on ""), the grace period longer than the ConfigMap's node.shutdown-timeout,
  fence-on-unclean-start on, the ConfigMap's TOML written out for `hasync config check`;
- the Grafana dashboard: JSON, unique panel ids, every panel with queries.

Usage: validate.py REPO_ROOT OUT_DIR   (OUT_DIR receives configmap-hasync.toml)
Prints one line per check; exits 1 if any failed.
"""

import json
import os
import re
import shlex
import sys
import tomllib

import yaml
from dockerfile_parse import DockerfileParser

ROOT, OUT = sys.argv[1], sys.argv[2]
PORTS = {"ha": 10912, "grpc": 10920, "metrics": 10921}
failures = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
    if not ok:
        failures.append(name)


def duration_seconds(text):
    total, rest = 0.0, text.replace(" ", "")
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for num, unit in re.findall(r"(\d+)(ms|s|m|h)", rest):
        total += int(num) * units[unit]
    if not re.fullmatch(r"((\d+)(ms|s|m|h))+", rest):
        raise ValueError(f"unsupported duration {text!r}")
    return total


# ---- Dockerfile -----------------------------------------------------------------------------
df_path = os.path.join(ROOT, "deploy/container/Dockerfile")
dfp = DockerfileParser(path=df_path)
stages, current = [], None
for ins in dfp.structure:
    cmd, value = ins["instruction"], ins["value"]
    if cmd == "FROM":
        parts = value.split()
        name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
        current = {"image": parts[0], "name": name, "workdir": "/", "ins": []}
        stages.append(current)
    elif current is not None:
        if cmd == "WORKDIR":
            current["workdir"] = os.path.join(current["workdir"], value)
        current["ins"].append((cmd, value))
check("Dockerfile: multi-stage (build + runtime)", len(stages) >= 2, f"{len(stages)} stage(s)")
build, runtime = stages[0], stages[-1]
build_runs = " ".join(v for c, v in build["ins"] if c == "RUN")
check(
    "Dockerfile: build stage runs `cargo build --release --locked --bin hasync`",
    all(w in build_runs for w in ["cargo build", "--release", "--locked", "--bin hasync"]),
    build_runs,
)
built = os.path.join(build["workdir"], "target/release/hasync")
copies = [shlex.split(v) for c, v in runtime["ins"] if c == "COPY"]
from_build = [c for c in copies if any(a == f"--from={build['name']}" for a in c)]
check(
    f"Dockerfile: runtime copies {built} from stage {build['name']!r}",
    len(from_build) == 1 and from_build[0][-2] == built,
    str(from_build),
)
binary = from_build[0][-1] if from_build else None
for c, v in build["ins"] + runtime["ins"]:
    if c == "COPY" and not v.startswith("--from"):
        for src in shlex.split(v)[:-1]:
            check(f"Dockerfile: COPY source {src} exists", os.path.exists(os.path.join(ROOT, src)))
exposed = set()
for c, v in runtime["ins"]:
    if c == "EXPOSE":
        exposed |= {int(p.split("/")[0]) for p in v.split()}
check("Dockerfile: EXPOSE 10912 10920 10921", exposed == set(PORTS.values()), str(sorted(exposed)))
users = [v for c, v in runtime["ins"] if c == "USER"]
check(
    "Dockerfile: runs as a non-root user",
    bool(users) and users[-1].split(":")[0] not in ("0", "root"),
    str(users),
)
volumes = [v for c, v in runtime["ins"] if c == "VOLUME"]
env = " ".join(v for c, v in runtime["ins"] if c == "ENV")
data_dir = re.search(r"HASYNC_DATA_DIR=(\S+)", env)
check(
    "Dockerfile: the data dir (HASYNC_DATA_DIR) is a VOLUME",
    bool(data_dir) and any(data_dir.group(1) in v for v in volumes),
    f"{env} / {volumes}",
)
health = [v for c, v in runtime["ins"] if c == "HEALTHCHECK"]
check(
    "Dockerfile: HEALTHCHECK runs `hasync health` on the gRPC port",
    bool(health) and binary is not None and binary in health[0] and "health" in health[0]
    and "10920" in health[0],
    str(health),
)
entry = [v for c, v in runtime["ins"] if c == "ENTRYPOINT"]
check("Dockerfile: ENTRYPOINT is the copied binary", bool(entry) and binary in entry[0], str(entry))
cmd = [v for c, v in runtime["ins"] if c == "CMD"]
cfg_copied = [c[-1] for c in copies if "--from" not in " ".join(c)]
check(
    "Dockerfile: CMD serves the config file it copies",
    bool(cmd) and "serve" in cmd[0] and any(p in cmd[0] for p in cfg_copied),
    f"{cmd} / {cfg_copied}",
)

# ---- Kubernetes -----------------------------------------------------------------------------
kdir = os.path.join(ROOT, "deploy/kubernetes")
docs = {}
for f in sorted(os.listdir(kdir)):
    if f.endswith((".yaml", ".yml")):
        with open(os.path.join(kdir, f)) as fh:
            for d in yaml.safe_load_all(fh):
                if d:
                    docs[(d["kind"], d["metadata"]["name"])] = d
kinds = {k for k, _ in docs}
for kind in ["ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget", "Job"]:
    check(f"kubernetes: a {kind}", kind in kinds, str(sorted(kinds)))
cm = next(d for (k, _), d in docs.items() if k == "ConfigMap")
sts = next(d for (k, _), d in docs.items() if k == "StatefulSet")
svc = next(d for (k, _), d in docs.items() if k == "Service")
cm_toml = tomllib.loads(cm["data"]["hasync.toml"])
with open(os.path.join(OUT, "configmap-hasync.toml"), "w") as fh:
    fh.write(cm["data"]["hasync.toml"])
check(
    "kubernetes: ConfigMap has node.fence-on-unclean-start = true",
    cm_toml.get("node", {}).get("fence-on-unclean-start") is True,
)
for section, port in PORTS.items():
    listen = cm_toml.get(section, {}).get("listen", f"0.0.0.0:{port}")
    check(f"kubernetes: ConfigMap {section}.listen port {port}", listen.endswith(f":{port}"), listen)
pod = sts["spec"]["template"]["spec"]
c = pod["containers"][0]
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
check("kubernetes: StatefulSet container ports", ports == PORTS, str(ports))
svc_ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
check("kubernetes: Service ports", svc_ports == PORTS, str(svc_ports))
check("kubernetes: Service is headless", svc["spec"].get("clusterIP") == "None")
check(
    "kubernetes: Service publishes not-ready addresses (a SYNC master is not ready alone)",
    svc["spec"].get("publishNotReadyAddresses") is True,
)
check("kubernetes: StatefulSet serviceName is the headless Service",
      sts["spec"]["serviceName"] == svc["metadata"]["name"])
check("kubernetes: podManagementPolicy Parallel", sts["spec"].get("podManagementPolicy") == "Parallel")
ready, live = c.get("readinessProbe", {}), c.get("livenessProbe", {})
check(
    "kubernetes: readiness is a gRPC probe of hasync.v1.Replication on 10920",
    ready.get("grpc", {}).get("port") == 10920
    and ready.get("grpc", {}).get("service") == "hasync.v1.Replication",
    str(ready),
)
check(
    "kubernetes: liveness is a gRPC probe of \"\" on 10920",
    live.get("grpc", {}).get("port") == 10920 and live.get("grpc", {}).get("service", "") == "",
    str(live),
)
grace = pod.get("terminationGracePeriodSeconds", 30)
bound = duration_seconds(cm_toml.get("node", {}).get("shutdown-timeout", "30s"))
check(
    f"kubernetes: terminationGracePeriodSeconds ({grace}) > node.shutdown-timeout ({bound:g}s)",
    grace > bound,
)
check("kubernetes: pods run as non-root", pod.get("securityContext", {}).get("runAsNonRoot") is True)
mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
check(
    "kubernetes: the data volume is mounted on node.data-dir",
    cm_toml.get("node", {}).get("data-dir") in mounts,
    f"{cm_toml.get('node', {}).get('data-dir')} vs {mounts}",
)
claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
check("kubernetes: a volumeClaimTemplate per pod", bool(claims & {m["name"] for m in c["volumeMounts"]}))
labels = sts["spec"]["selector"]["matchLabels"]
pdb = next(d for (k, _), d in docs.items() if k == "PodDisruptionBudget")
check("kubernetes: PDB selects the StatefulSet's pods", pdb["spec"]["selector"]["matchLabels"] == labels)
check("kubernetes: Service selects the StatefulSet's pods", svc["spec"]["selector"] == labels)
job = next(d for (k, _), d in docs.items() if k == "Job")
script = " ".join(job["spec"]["template"]["spec"]["containers"][0].get("args", []))
check(
    "kubernetes: failover Job runs `hasync role master` then `hasync role slave` with --epoch",
    re.search(r"hasync role master --epoch", script) is not None
    and re.search(r"hasync role slave --master-ha .*--master-grpc .*--epoch", script, re.S) is not None,
    script[:200],
)

# ---- Grafana --------------------------------------------------------------------------------
with open(os.path.join(ROOT, "deploy/grafana/hasync.json")) as fh:
    dash = json.load(fh)
panels = [p for p in dash.get("panels", []) if p.get("type") != "row"]
ids = [p["id"] for p in dash.get("panels", [])]
check("grafana: dashboard has a title and uid", bool(dash.get("title")) and bool(dash.get("uid")))
check("grafana: panel ids are unique", len(ids) == len(set(ids)))
check("grafana: at least 20 panels", len(panels) >= 20, str(len(panels)))
empty = [p["title"] for p in panels if not any(t.get("expr") for t in p.get("targets", []))]
check("grafana: every panel has a query", not empty, str(empty))

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
