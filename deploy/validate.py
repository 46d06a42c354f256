"""Checks of deploy/ that no off-the-shelf validator makes, run by deploy/validate.sh in its venv
(PyYAML from kubernetes-validate, dockerfile-parse):

- the Dockerfile: the runtime stage copies the binary from the path the build stage's
  `cargo build --release` writes, exposes 10912/10920/10921, runs as a non-root user, declares
  the data dir as a volume, health-checks with `hasync health`, copies only files that exist;
- the Kubernetes manifests, for every broker group (a StatefulSet whose pods are labelled
  app.kubernetes.io/component=broker and hasync.io/group; two at least, broker-a and broker-b
  documented): ports, native gRPC probes (readiness on hasync.v1.Replication, liveness on ""),
  the grace period longer than the ConfigMap's node.shutdown-timeout, fence-on-unclean-start
  on; the ConfigMap key the start script reads (--config, through the mounted volume) has
  coordinator.group equal to the pods' group label, endpoints pointing at the etcd members and
  the role label on; the headless Service, the master Service (the group's selector plus
  hasync.io/role=master) and the PodDisruptionBudget select exactly the group's pods; RBAC:
  the group's own service account may patch its group's pods and no other's, patch only;
  the start script's environment names its StatefulSet, Service and the group's
  master-ordinal;
- the groups together: no object defined twice (a group file copied without renaming), every
  broker Service and budget selects the pods of one group only (as master and as slave),
  every [coordinator] key but the group the same in all groups (one etcd, one cluster: one
  controller campaign, the nodes' controllers, one active), the node configs differing only
  in coordinator.group, distinct group names; the three-member etcd (image 3.4/3.5, data on a
  volume, auto-compaction); the failover Job as the manual override (`hasync failover ...
  --accept-data-loss`) naming a group, one of its pods and a node's gRPC address;
- each broker pod's start: the StatefulSet's start script with that pod's environment, written
  to OUT_DIR/pods/POD.sh (validate.sh runs it with `hasync serve --print-config`), and
  `--printed` checks what it printed: the pod's group, name, role, advertised addresses and
  first master;
- the Prometheus rules: the coordinator alerts are there;
- the Grafana dashboard: JSON, unique panel ids, every panel with queries.

Usage: validate.py REPO_ROOT OUT_DIR   (OUT_DIR receives STATEFULSET.toml, pods/POD.sh,
                                        pods.list and pods.json)
       validate.py --printed OUT_DIR     (reads OUT_DIR/pods/POD.printed.toml)
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


def check_printed(out):
    """What `hasync serve --print-config` printed for each broker pod (validate.sh ran the
    start scripts this file wrote) is that pod's configuration: its group, name, role and
    addresses, in coordinator mode with the role label."""
    with open(os.path.join(out, "pods.json")) as fh:
        pods = json.load(fh)
    check("printed: a configuration per broker pod", len(pods) >= 4, str(len(pods)))
    for want in pods:
        p = want["pod"]
        with open(os.path.join(out, "pods", f"{p}.printed.toml")) as fh:
            text = fh.read()
        try:
            got = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            check(f"printed {p}: TOML", False, f"{e}: {text[:200]!r}")
            continue
        node, coord = got.get("node", {}), got.get("coordinator", {})
        check(f"printed {p}: coordinator.group = {want['group']!r}",
              coord.get("group") == want["group"], str(coord.get("group")))
        check(f"printed {p}: coordinator.cluster = {want['cluster']!r}, endpoints set",
              coord.get("cluster") == want["cluster"] and bool(coord.get("endpoints")))
        check(f"printed {p}: node.name = {p!r}, node.role = {want['role']}",
              node.get("name") == p and node.get("role") == want["role"],
              f"{node.get('name')} {node.get('role')}")
        check(f"printed {p}: advertises {want['advertise-grpc']} and {want['advertise-ha']}",
              node.get("advertise-grpc") == want["advertise-grpc"]
              and node.get("advertise-ha") == want["advertise-ha"],
              f"{node.get('advertise-grpc')} {node.get('advertise-ha')}")
        check(f"printed {p}: slave.master-grpc is its group's first master {want['master-grpc']}",
              got.get("slave", {}).get("master-grpc") == want["master-grpc"],
              str(got.get("slave", {}).get("master-grpc")))
        check(f"printed {p}: kubernetes.role-label = true",
              got.get("kubernetes", {}).get("role-label") is True)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if sys.argv[1:2] == ["--printed"]:
    sys.exit(check_printed(sys.argv[2]))
ROOT, OUT = sys.argv[1], sys.argv[2]

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
docs, origin, twice = {}, {}, []
for f in sorted(os.listdir(kdir)):
    if f.endswith((".yaml", ".yml")):
        with open(os.path.join(kdir, f)) as fh:
            for d in yaml.safe_load_all(fh):
                if d:
                    key = (d["kind"], d["metadata"]["name"])
                    if key in docs:
                        twice.append(f"{key[0]} {key[1]} in {origin[key]} and {f}")
                    docs[key], origin[key] = d, f
# A group file copied without renaming everything would silently replace the other group's
# objects on `kubectl apply`.
check("kubernetes: no object is defined twice", not twice, "; ".join(twice))
kinds = {k for k, _ in docs}
for kind in ["ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget", "Job",
             "ServiceAccount", "Role", "RoleBinding"]:
    check(f"kubernetes: a {kind}", kind in kinds, str(sorted(kinds)))
for key in [("Job", "hasync-failover"), ("StatefulSet", "hasync-etcd"), ("Service", "hasync-etcd"),
            ("PodDisruptionBudget", "hasync-etcd")]:
    check(f"kubernetes: {key[0]} {key[1]}", key in docs, str(sorted(docs)))

GROUP_LABEL, ROLE_LABEL = "hasync.io/group", "hasync.io/role"


def selects(selector, labels):
    """Whether a Service selector / matchLabels picks a pod with these labels."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def selector_of(d):
    spec = d.get("spec", {})
    if d["kind"] == "Service":
        return spec.get("selector") or {}
    return spec.get("selector", {}).get("matchLabels") or {}


def flag(args, name):
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)


etcd = docs[("StatefulSet", "hasync-etcd")]
etcd_svc = docs[("Service", "hasync-etcd")]
etcd_members = [f"{etcd['metadata']['name']}-{i}" for i in range(etcd["spec"].get("replicas", 1))]
etcd_endpoints = {f"{m}.{etcd_svc['metadata']['name']}:2379" for m in etcd_members}

# The broker groups: one StatefulSet each (its pods labelled component=broker and
# hasync.io/group), with its ConfigMap, headless and master Services, budget and RBAC.
brokers = sorted((d for (k, _), d in docs.items() if k == "StatefulSet"
                  and d["spec"]["template"]["metadata"].get("labels", {})
                  .get("app.kubernetes.io/component") == "broker"),
                 key=lambda d: d["metadata"]["name"])
names = [b["metadata"]["name"] for b in brokers]
check("kubernetes: two broker groups or more (one StatefulSet each)", len(brokers) >= 2, str(names))
for name in ["hasync-broker-a", "hasync-broker-b"]:
    check(f"kubernetes: StatefulSet {name} (the documented groups)", name in names, str(names))

groups = {}        # group -> {"sts", "labels", "toml" (parsed), "text", "pods"}
pods_out = []      # per pod: what its start must print (validate.py --printed)
os.makedirs(os.path.join(OUT, "pods"), exist_ok=True)
ns = "default"
for sts in brokers:
    S = sts["metadata"]["name"]
    pod = sts["spec"]["template"]["spec"]
    tmpl_labels = sts["spec"]["template"]["metadata"].get("labels", {})
    labels = sts["spec"]["selector"]["matchLabels"]
    group = labels.get(GROUP_LABEL)
    check(f"{S}: its selector includes the group label {GROUP_LABEL}", bool(group), str(labels))
    check(f"{S}: the pod template carries the selector's labels", selects(labels, tmpl_labels),
          f"{labels} vs {tmpl_labels}")
    check(f"{S}: no {ROLE_LABEL} in its selector or pod template (the nodes set it)",
          ROLE_LABEL not in labels and ROLE_LABEL not in tmpl_labels)
    check(f"{S}: the StatefulSet itself is labelled with its group",
          sts["metadata"].get("labels", {}).get(GROUP_LABEL) == group)
    if not group:
        continue
    check(f"{S}: group {group} has one StatefulSet", group not in groups, group)
    c = pod["containers"][0]

    # Its configuration: the ConfigMap key mounted where the start script reads it.
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files = {}  # path in the container -> (ConfigMap name, key)
    for m in c.get("volumeMounts", []):
        cmv = volumes.get(m["name"], {}).get("configMap")
        if cmv:
            for item in cmv.get("items", []):
                files[os.path.join(m["mountPath"], item["path"])] = (cmv["name"], item["key"])
    start = c.get("args", [""])[0] if c.get("command", [])[-1:] == ["-c"] else ""
    at = re.search(r"--config (\S+)", start)
    check(f"{S}: the start script's --config is a mounted ConfigMap key",
          at is not None and at.group(1) in files, f"{at and at.group(1)} vs {sorted(files)}")
    if at is None or at.group(1) not in files:
        continue
    cm_name, cm_key = files[at.group(1)]
    cm = docs.get(("ConfigMap", cm_name), {})
    check(f"{S}: its ConfigMap {cm_name} has the key {cm_key}", cm_key in cm.get("data", {}))
    text = cm.get("data", {}).get(cm_key, "")
    cm_toml = tomllib.loads(text)
    toml_path = os.path.join(OUT, f"{S}.toml")
    with open(toml_path, "w") as fh:
        fh.write(text)
    coord = cm_toml.get("coordinator", {})
    check(f"{S}: its ConfigMap's coordinator.group is the pods' group label ({group})",
          coord.get("group") == group, str(coord.get("group")))
    check(f"{S}: its ConfigMap is labelled with the group",
          cm.get("metadata", {}).get("labels", {}).get(GROUP_LABEL) == group)
    check(f"{S}: ConfigMap has node.fence-on-unclean-start = true",
          cm_toml.get("node", {}).get("fence-on-unclean-start") is True)
    for section, port in PORTS.items():
        listen = cm_toml.get(section, {}).get("listen", f"0.0.0.0:{port}")
        check(f"{S}: ConfigMap {section}.listen port {port}", listen.endswith(f":{port}"), listen)
    check(f"{S}: ConfigMap coordinator.endpoints are the etcd members",
          set(coord.get("endpoints", [])) == etcd_endpoints,
          f"{coord.get('endpoints')} vs {sorted(etcd_endpoints)}")
    check(f"{S}: ConfigMap coordinator.cluster is set", bool(coord.get("cluster")))
    check(f"{S}: ConfigMap kubernetes.role-label = true",
          cm_toml.get("kubernetes", {}).get("role-label") is True)

    # The pods.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(f"{S}: container ports", ports == PORTS, str(ports))
    ready, live = c.get("readinessProbe", {}), c.get("livenessProbe", {})
    check(
        f"{S}: readiness is a gRPC probe of hasync.v1.Replication on 10920",
        ready.get("grpc", {}).get("port") == 10920
        and ready.get("grpc", {}).get("service") == "hasync.v1.Replication",
        str(ready),
    )
    check(
        f"{S}: liveness is a gRPC probe of \"\" on 10920",
        live.get("grpc", {}).get("port") == 10920 and live.get("grpc", {}).get("service", "") == "",
        str(live),
    )
    grace = pod.get("terminationGracePeriodSeconds", 30)
    bound = duration_seconds(cm_toml.get("node", {}).get("shutdown-timeout", "30s"))
    check(f"{S}: terminationGracePeriodSeconds ({grace}) > node.shutdown-timeout ({bound:g}s)",
          grace > bound)
    check(f"{S}: pods run as non-root", pod.get("securityContext", {}).get("runAsNonRoot") is True)
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
    check(f"{S}: the data volume is mounted on node.data-dir",
          cm_toml.get("node", {}).get("data-dir") in mounts,
          f"{cm_toml.get('node', {}).get('data-dir')} vs {mounts}")
    claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    check(f"{S}: a volumeClaimTemplate per pod", bool(claims & {m["name"] for m in c["volumeMounts"]}))
    check(f"{S}: podManagementPolicy Parallel", sts["spec"].get("podManagementPolicy") == "Parallel")
    anti = [t.get("podAffinityTerm", t).get("labelSelector", {}).get("matchLabels")
            for kind in ["preferredDuringSchedulingIgnoredDuringExecution",
                         "requiredDuringSchedulingIgnoredDuringExecution"]
            for t in pod.get("affinity", {}).get("podAntiAffinity", {}).get(kind, [])]
    check(f"{S}: the anti-affinity spreads the group's own pods", anti == [labels], str(anti))

    # The headless Service: serviceName.
    svc = docs.get(("Service", sts["spec"]["serviceName"]), {"spec": {}})
    svc_ports = {p["name"]: p["port"] for p in svc["spec"].get("ports", [])}
    check(f"{S}: serviceName {sts['spec']['serviceName']} is a Service", "metadata" in svc)
    check(f"{S}: headless Service ports", svc_ports == PORTS, str(svc_ports))
    check(f"{S}: its Service is headless", svc["spec"].get("clusterIP") == "None")
    check(f"{S}: its Service publishes not-ready addresses (a SYNC master is not ready alone)",
          svc["spec"].get("publishNotReadyAddresses") is True)
    check(f"{S}: its headless Service selects the group's pods", svc["spec"].get("selector") == labels,
          str(svc["spec"].get("selector")))

    # The master Service: the group's selector and hasync.io/role=master.
    want_master = {**labels, ROLE_LABEL: "master"}
    masters = [d for (k, _), d in docs.items() if k == "Service" and selector_of(d) == want_master]
    check(f"{S}: one Service selects the group's pod labelled {ROLE_LABEL}=master",
          len(masters) == 1, str([m["metadata"]["name"] for m in masters]))
    for m in masters:
        check(f"{S}: {m['metadata']['name']} has a cluster IP and the gRPC port only",
              m["spec"].get("clusterIP") != "None"
              and {p["port"] for p in m["spec"]["ports"]} == {PORTS["grpc"]})

    # The budget.
    budgets = [d for (k, _), d in docs.items() if k == "PodDisruptionBudget"
               and selects(selector_of(d), tmpl_labels)]
    check(f"{S}: one PodDisruptionBudget covers the group's pods (budgets must not overlap)",
          len(budgets) == 1, str([b["metadata"]["name"] for b in budgets]))
    for b in budgets:
        check(f"{S}: PDB {b['metadata']['name']} selects the group's pods, one at a time",
              selector_of(b) == labels and b["spec"].get("maxUnavailable") == 1)

    # The start script and its environment.
    check(f"{S}: the start script passes --name, --advertise-ha and --advertise-grpc",
          all(f in start for f in ["--name \"$POD_NAME\"", "--advertise-ha", "--advertise-grpc"]),
          start[:300])
    pod_env = {e["name"]: e for e in c.get("env", [])}
    check(f"{S}: POD_NAME (the labelled pod) from the downward API",
          pod_env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {})
          .get("fieldPath") == "metadata.name")
    check(f"{S}: STATEFULSET and SERVICE name this StatefulSet and its Service",
          pod_env.get("STATEFULSET", {}).get("value") == S
          and pod_env.get("SERVICE", {}).get("value") == sts["spec"]["serviceName"])
    replicas = sts["spec"].get("replicas", 1)
    pod_names = [f"{S}-{i}" for i in range(replicas)]

    def env_value(e, pod_name):
        """An env var's value in pod `pod_name`; None when unset (an optional secret)."""
        if "value" in e:
            return e["value"]
        src = e.get("valueFrom", {})
        if "fieldRef" in src:
            return {"metadata.name": pod_name, "metadata.namespace": ns}[src["fieldRef"]["fieldPath"]]
        if "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            return docs[("ConfigMap", ref["name"])]["data"][ref["key"]]
        if "secretKeyRef" in src and src["secretKeyRef"].get("optional"):
            return None
        raise ValueError(f"env {e['name']}: unsupported source {src}")

    master_ordinal = env_value(pod_env.get("MASTER_ORDINAL", {"value": ""}), "")
    check(f"{S}: MASTER_ORDINAL ({master_ordinal}) comes from the group's ConfigMap and is a pod",
          pod_env.get("MASTER_ORDINAL", {}).get("valueFrom", {}).get("configMapKeyRef", {})
          .get("name") == cm_name and master_ordinal in {str(i) for i in range(replicas)})
    # The start script as each pod runs it (validate.sh runs these files, with the binary it
    # built printing the effective config instead of serving).
    binary_at = "/usr/local/bin/hasync serve "
    check(f"{S}: the start script execs {binary_at.strip()} once", start.count(binary_at) == 1)
    script = start.replace(binary_at, '"$HASYNC_BIN" serve --print-config ')
    script = script.replace(f"--config {at.group(1)}", f"--config {shlex.quote(toml_path)}")
    for i, p in enumerate(pod_names):
        env_lines = []
        for e in c.get("env", []):
            v = env_value(e, p)
            if v is not None:
                env_lines.append(f"export {e['name']}={shlex.quote(v)}")
        path = os.path.join(OUT, "pods", f"{p}.sh")
        with open(path, "w") as fh:
            fh.write(f"# pod {p} of StatefulSet {S} in namespace {ns}, written by deploy/validate.py\n")
            fh.write("\n".join(env_lines) + "\n" + script)
        dns = lambda n: f"{n}.{sts['spec']['serviceName']}.{ns}.svc"
        pods_out.append({
            "pod": p, "script": path, "group": group,
            "role": "master" if str(i) == master_ordinal else "slave",
            "advertise-grpc": f"{dns(p)}:10920", "advertise-ha": f"{dns(p)}:10912",
            "master-grpc": f"{dns(f'{S}-{master_ordinal}')}:10920",
            "cluster": coord.get("cluster"),
        })

    # RBAC: the pods' account may patch the group's pods, nothing else.
    account = pod.get("serviceAccountName")
    check(f"{S}: runs under its own service account",
          account is not None and ("ServiceAccount", account) in docs, str(account))
    bound_ = [d for (k, _), d in docs.items() if k == "RoleBinding"
              and any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                      for s in d["subjects"])]
    roles = [docs.get(("Role", b["roleRef"]["name"])) for b in bound_ if b["roleRef"]["kind"] == "Role"]
    groups[group] = {"sts": sts, "labels": tmpl_labels, "toml": cm_toml, "pods": pod_names,
                     "roles": roles, "account": account}


def may_patch(role, pod_name):
    return any("" in r.get("apiGroups", []) and "pods" in r.get("resources", [])
               and "patch" in r.get("verbs", [])
               and ("resourceNames" not in r or pod_name in r["resourceNames"])
               for r in (role or {}).get("rules", []))


for group, g in groups.items():
    S = g["sts"]["metadata"]["name"]
    check(f"{S}: RBAC lets its service account patch every pod of the group",
          all(any(may_patch(r, p) for r in g["roles"]) for p in g["pods"]),
          f"{g['pods']} {g['roles']}")
    others = [p for o, og in groups.items() if o != group for p in og["pods"]]
    check(f"{S}: its service account may patch no other group's pod",
          not any(may_patch(r, p) for r in g["roles"] for p in others), str(g["roles"]))
    too_much = [r for role in g["roles"] for r in (role or {}).get("rules", [])
                if set(r.get("verbs", [])) - {"patch"}]
    check(f"{S}: its role grants patch only", not too_much, str(too_much))
    shared = [o for o, og in groups.items() if o != group and og["account"] == g["account"]]
    check(f"{S}: its service account is the group's own", not shared, str(shared))

# ---- Kubernetes: the groups together ----------------------------------------------------------
# Every broker-selecting object picks the pods of exactly one group, whatever role label the
# nodes put on them: broker-a's Services never route to broker-b's pods.
for (kind, name), d in sorted(docs.items()):
    if kind not in ("Service", "PodDisruptionBudget"):
        continue
    sel = selector_of(d)
    if sel.get("app.kubernetes.io/component") != "broker":
        continue
    hit = sorted({grp for grp, g in groups.items() for role in ("master", "slave")
                  if selects(sel, {**g["labels"], ROLE_LABEL: role})})
    check(f"kubernetes: {kind} {name} selects the pods of one group only", len(hit) == 1, str(hit))
    own = d["metadata"].get("labels", {}).get(GROUP_LABEL)
    check(f"kubernetes: {kind} {name} is labelled with the group it selects", hit == [own],
          f"{own} vs {hit}")
for grp, g in groups.items():
    check(f"kubernetes: the etcd Service selects no pod of group {grp}",
          not selects(selector_of(etcd_svc), g["labels"]))

# One etcd and one controller for all groups: the same endpoints, prefix and cluster (one
# campaign: one active controller), every [coordinator] key but the group the same, and a
# controller in the nodes (no standalone controller is deployed).
def without_group(t):
    return {**t, "coordinator": {k: v for k, v in t.get("coordinator", {}).items() if k != "group"}}


def differing(a, b, at=""):
    """The dotted keys whose values differ between two parsed TOML tables."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [at.strip(".")]
    return [k for key in sorted(set(a) | set(b))
            for k in differing(a.get(key), b.get(key), f"{at}{key}.")]


tomls = {grp: g["toml"] for grp, g in groups.items()}
first_group, first = next(iter(tomls.items()), ("", {}))
diffs = {grp: differing(without_group(first)["coordinator"], without_group(t)["coordinator"],
                       "coordinator.") for grp, t in tomls.items()}
check("kubernetes: every group's [coordinator] but the group is the same (one etcd, one cluster)",
      not any(diffs.values()),
      "; ".join(f"{grp} vs {first_group}: {', '.join(d)}" for grp, d in diffs.items() if d))
diffs = {grp: differing(without_group(first), without_group(t)) for grp, t in tomls.items()}
check("kubernetes: the groups' node configs differ only in coordinator.group",
      not any(diffs.values()),
      "; ".join(f"{grp} vs {first_group}: {', '.join(d)}" for grp, d in diffs.items() if d))
check("kubernetes: the groups' names differ",
      len({t.get("coordinator", {}).get("group") for t in tomls.values()}) == len(tomls),
      str({g["sts"]["metadata"]["name"]: t.get("coordinator", {}).get("group")
           for g, t in zip(groups.values(), tomls.values())}))
check("kubernetes: the nodes run the cluster's controller (coordinator.controller, one active)",
      all(t.get("coordinator", {}).get("controller", True) is True for t in tomls.values()))
check("kubernetes: no standalone controller Deployment beside the nodes' controllers",
      not any(k == "Deployment" for k, _ in docs))

job = docs[("Job", "hasync-failover")]
job_c = job["spec"]["template"]["spec"]["containers"][0]
script = " ".join(job_c.get("args", []))
check(
    "kubernetes: failover Job is the manual override `hasync failover --group --to --accept-data-loss`",
    re.search(r"hasync failover --group \S+ --to \S+ --accept-data-loss", script) is not None
    and "hasync role" not in script,
    script[:200],
)
check("kubernetes: the failover Job mounts no service account token",
      job["spec"]["template"]["spec"].get("automountServiceAccountToken") is False)
job_env = {e["name"]: e.get("value") for e in job_c.get("env", [])}
jg = groups.get(job_env.get("GROUP"), {})
check("kubernetes: the failover Job's GROUP is a group and TO one of its pods",
      bool(jg) and job_env.get("TO") in jg.get("pods", []), str(job_env))
node_addrs = {f"{p}.{g['sts']['spec']['serviceName']}:10920" for g in groups.values() for p in g["pods"]}
check("kubernetes: the failover Job's GRPC is a broker pod's gRPC address",
      job_env.get("GRPC") in node_addrs, str(job_env.get("GRPC")))

with open(os.path.join(OUT, "pods.json"), "w") as fh:
    json.dump(pods_out, fh, indent=1)
with open(os.path.join(OUT, "pods.list"), "w") as fh:
    fh.write("".join(p["pod"] + "\n" for p in pods_out))

# ---- Kubernetes: etcd -------------------------------------------------------------------------
etcd_pod = etcd["spec"]["template"]["spec"]
etcd_c = etcd_pod["containers"][0]
etcd_args = etcd_c.get("command", []) + etcd_c.get("args", [])
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
check("etcd: --initial-cluster names every member",
      sorted(m.split("=")[0] for m in initial.split(",")) == etcd_members, initial)
check("etcd: a PodDisruptionBudget of one", docs.get(("PodDisruptionBudget", "hasync-etcd"), {})
      .get("spec", {}).get("maxUnavailable") == 1)

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
