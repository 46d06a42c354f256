"""Checks of deploy/ that no off-the-shelf validator makes, run by deploy/validate.sh in its venv
(PyYAML from kubernetes-validate, dockerfile-parse):

- the Dockerfile: the runtime stage copies the binary from the path the build stage's
  `cargo build --release` writes, exposes 10912/10920/10921, runs as a non-root user, declares
  the data dir as a volume, health-checks with `hasync health`, copies only files that exist;
- the Kubernetes manifests: ports, native gRPC probes (readiness on hasync.v1.Replication,
  liveness on ""), the grace period longer than the ConfigMap's node.shutdown-timeout,
  fence-on-unclean-start on, the ConfigMap's TOML written out for `hasync serve
  --print-config`; coordinator mode: the three-member etcd (image 3.4/3.5, data on a volume,
  auto-compaction) and the ConfigMap's endpoints pointing at its members, the role label on
  with RBAC (patch on every broker pod, bound to the StatefulSet's service account), the
  master Service selecting hasync.io/role=master, the start script's advertised addresses,
  the failover Job as the manual override (`hasync failover ... --accept-data-loss`);
- the Prometheus rules: the coordinator alerts are there;
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
for kind in ["ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget", "Job",
             "ServiceAccount", "Role", "RoleBinding"]:
    check(f"kubernetes: a {kind}", kind in kinds, str(sorted(kinds)))
for key in [("ConfigMap", "hasync-config"), ("StatefulSet", "hasync"), ("Service", "hasync"),
            ("PodDisruptionBudget", "hasync"), ("Job", "hasync-failover"),
            ("StatefulSet", "hasync-etcd"), ("Service", "hasync-etcd"),
            ("Service", "hasync-master")]:
    check(f"kubernetes: {key[0]} {key[1]}", key in docs, str(sorted(docs)))
cm = docs[("ConfigMap", "hasync-config")]
sts = docs[("StatefulSet", "hasync")]
svc = docs[("Service", "hasync")]
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
pdb = docs[("PodDisruptionBudget", "hasync")]
check("kubernetes: PDB selects the StatefulSet's pods", pdb["spec"]["selector"]["matchLabels"] == labels)
check("kubernetes: Service selects the StatefulSet's pods", svc["spec"]["selector"] == labels)
job = docs[("Job", "hasync-failover")]
script = " ".join(job["spec"]["template"]["spec"]["containers"][0].get("args", []))
check(
    "kubernetes: failover Job is the manual override `hasync failover --group --to --accept-data-loss`",
    re.search(r"hasync failover --group \S+ --to \S+ --accept-data-loss", script) is not None
    and "hasync role" not in script,
    script[:200],
)

# ---- Kubernetes: coordinator mode -------------------------------------------------------------
etcd = docs[("StatefulSet", "hasync-etcd")]
etcd_svc = docs[("Service", "hasync-etcd")]
etcd_pod = etcd["spec"]["template"]["spec"]
etcd_c = etcd_pod["containers"][0]
etcd_args = etcd_c.get("command", []) + etcd_c.get("args", [])
def flag(args, name):
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)
replicas = etcd["spec"].get("replicas", 1)
check("etcd: three members", replicas == 3, str(replicas))
check("etcd: image is etcd 3.4 or 3.5", re.search(r"etcd:v?3\.[45]\.\d+", etcd_c["image"]) is not None,
      etcd_c["image"])
check("etcd: StatefulSet serviceName is its headless Service",
      etcd["spec"]["serviceName"] == etcd_svc["metadata"]["name"]
      and etcd_svc["spec"].get("clusterIP") == "None")
check("etcd: the headless Service publishes not-ready addresses (peers meet before a quorum)",
      etcd_svc["spec"].get("publishNotReadyAddresses") is True)
check("etcd: Service selects its pods", etcd_svc["spec"]["selector"] == etcd["spec"]["selector"]["matchLabels"])
check("etcd: podManagementPolicy Parallel", etcd["spec"].get("podManagementPolicy") == "Parallel")
data_dir = flag(etcd_args, "data-dir")
etcd_mounts = {m["mountPath"]: m["name"] for m in etcd_c.get("volumeMounts", [])}
etcd_claims = {t["metadata"]["name"] for t in etcd["spec"].get("volumeClaimTemplates", [])}
check("etcd: --data-dir is on a volumeClaimTemplate",
      data_dir in etcd_mounts and etcd_mounts[data_dir] in etcd_claims, f"{data_dir} {etcd_mounts}")
check("etcd: --auto-compaction-retention is set", bool(flag(etcd_args, "auto-compaction-retention")))
initial = flag(etcd_args, "initial-cluster") or ""
etcd_name = etcd["metadata"]["name"]
members = [f"{etcd_name}-{i}" for i in range(replicas)]
check("etcd: --initial-cluster names every member",
      sorted(m.split("=")[0] for m in initial.split(",")) == members, initial)
check("etcd: a PodDisruptionBudget of one", docs.get(("PodDisruptionBudget", "hasync-etcd"), {})
      .get("spec", {}).get("maxUnavailable") == 1)

coord = cm_toml.get("coordinator", {})
want = {f"{m}.{etcd_svc['metadata']['name']}:2379" for m in members}
check("kubernetes: ConfigMap coordinator.endpoints are the etcd members",
      set(coord.get("endpoints", [])) == want, f"{coord.get('endpoints')} vs {sorted(want)}")
check("kubernetes: ConfigMap coordinator.cluster and group are set",
      bool(coord.get("cluster")) and bool(coord.get("group")))
check("kubernetes: ConfigMap kubernetes.role-label = true",
      cm_toml.get("kubernetes", {}).get("role-label") is True)
start = " ".join(c.get("args", []))
check("kubernetes: the start script passes --name, --advertise-ha and --advertise-grpc",
      all(f in start for f in ["--name \"$POD_NAME\"", "--advertise-ha", "--advertise-grpc"]), start[:300])
pod_env = {e["name"]: e for e in c.get("env", [])}
check("kubernetes: POD_NAME (the labelled pod) from the downward API",
      pod_env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name")

account = pod.get("serviceAccountName")
check("kubernetes: the StatefulSet runs under its own service account",
      account is not None and ("ServiceAccount", account) in docs, str(account))
broker_pods = {f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"].get("replicas", 1))}
bound = [d for (k, _), d in docs.items() if k == "RoleBinding"
         and any(s.get("kind") == "ServiceAccount" and s.get("name") == account for s in d["subjects"])]
roles = [docs.get(("Role", b["roleRef"]["name"])) for b in bound if b["roleRef"]["kind"] == "Role"]
def may_patch(role, pod_name):
    return any("" in r.get("apiGroups", []) and "pods" in r.get("resources", [])
               and "patch" in r.get("verbs", [])
               and ("resourceNames" not in r or pod_name in r["resourceNames"])
               for r in (role or {}).get("rules", []))
check("kubernetes: RBAC lets the service account patch every broker pod",
      all(any(may_patch(r, p) for r in roles) for p in broker_pods), f"{sorted(broker_pods)} {roles}")
too_much = [r for role in roles for r in (role or {}).get("rules", [])
            if set(r.get("verbs", [])) - {"patch"}]
check("kubernetes: the role grants patch only", not too_much, str(too_much))
master_svc = docs[("Service", "hasync-master")]
check("kubernetes: hasync-master selects the broker pods labelled hasync.io/role=master",
      master_svc["spec"]["selector"] == {**labels, "hasync.io/role": "master"},
      str(master_svc["spec"]["selector"]))
check("kubernetes: hasync-master has a cluster IP and the gRPC port",
      master_svc["spec"].get("clusterIP") != "None"
      and {p["port"] for p in master_svc["spec"]["ports"]} == {PORTS["grpc"]})
check("kubernetes: the failover Job mounts no service account token",
      job["spec"]["template"]["spec"].get("automountServiceAccountToken") is False)

# ---- Prometheus -----------------------------------------------------------------------------
with open(os.path.join(ROOT, "deploy/prometheus/rules.yml")) as fh:
    rules = yaml.safe_load(fh)
alerts = {r.get("alert") for g in rules["groups"] for r in g["rules"]}
for a in ["HasyncCoordinatorLeaseLost", "HasyncFailoverBlocked", "HasyncNoActiveController",
          "HasyncFailoversFrequent"]:
    check(f"prometheus: alert {a}", a in alerts)

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
