#!/usr/bin/env bash
# Validates deploy/ with real validators; exits non-zero when any file is broken.
#
#   hasync config check      deploy/config/*.toml (the nodes'); controller.toml with
#                            `hasync controller --print-config`; every broker group's ConfigMap
#                            hasync.toml as its StatefulSet starts each pod (the start script
#                            with the pod's environment, `serve --print-config`: master and
#                            slave of broker-a and broker-b, each with its own group)
#   systemd-analyze          verify (any warning fails) and security (exposure <= 2.0) of each
#                            unit (hasync.service, hasync-controller.service)
#   promtool                 check rules, test rules (rules_test.yml)
#   kubernetes-validate      --strict on every manifest (PyPI, schemas bundled, offline)
#   deploy/validate.py       Dockerfile paths/ports/user, manifest cross-checks (per group and
#                            between groups: selectors, labels, RBAC, the shared etcd and
#                            controller), dashboard JSON
#
# Every hasync_* metric the dashboard and the rules query is checked against a live scrape by
# tests/it/deploy.rs (cargo test), which also runs `promtool check metrics` on the scrape.
# Installs what is missing: promtool (Debian package prometheus, with apt-get), and
# kubernetes-validate + dockerfile-parse in the venv .ci/venv (shared with tests/python).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
started=$(date +%s)
venv=.ci/venv
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
step() { printf '\n== %s\n' "$*"; }
bad() { echo "FAIL $*"; fail=1; }

# ---- tools ------------------------------------------------------------------------------------
if ! command -v promtool >/dev/null; then
  step "installing promtool (Debian package prometheus)"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
command -v systemd-analyze >/dev/null || { echo "systemd-analyze is missing"; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import kubernetes_validate, dockerfile_parse' 2>/dev/null; then
  step "installing kubernetes-validate and dockerfile-parse in $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'kubernetes-validate>=1.30' 'dockerfile-parse>=2.0'
fi
cargo build --locked --bin hasync -q
target_dir=${CARGO_TARGET_DIR:-$root/target}
hasync=$target_dir/debug/hasync

# ---- configs ----------------------------------------------------------------------------------
step "hasync config check"
for f in deploy/config/*.toml; do
  [ "$(basename "$f")" = controller.toml ] && continue
  "$hasync" config check "$f" || bad "$f"
done
step "hasync controller --print-config: deploy/config/controller.toml"
"$hasync" controller --config deploy/config/controller.toml --print-config >/dev/null \
  && echo "ok: deploy/config/controller.toml" || bad "deploy/config/controller.toml"

step "deploy/validate.py (Dockerfile, manifests, dashboard)"
"$venv/bin/python" deploy/validate.py "$root" "$tmp" || bad "deploy/validate.py"

step "hasync serve --print-config: each broker group's ConfigMap, as its StatefulSet starts each pod"
# validate.py wrote, per pod of every group's StatefulSet, its start script with the pod's
# environment (name, namespace, the group's master-ordinal) and the binary printing the
# effective configuration instead of serving; `validate.py --printed` then checks that each
# pod got its group's coordinator.group, its name, role and addresses.
if [ -s "$tmp/pods.list" ]; then
  while read -r pod; do
    # env -i: no HASYNC_* variable of this shell reaches the pod's configuration.
    if env -i PATH="$PATH" HASYNC_BIN="$hasync" sh "$tmp/pods/$pod.sh" \
      >"$tmp/pods/$pod.printed.toml" </dev/null; then
      echo "ok: pod $pod starts ($(grep -m1 '^role = ' "$tmp/pods/$pod.printed.toml" || echo 'no role'))"
    else
      bad "pod $pod: its start script with serve --print-config"
      : >"$tmp/pods/$pod.printed.toml"
    fi
  done <"$tmp/pods.list"
  "$venv/bin/python" deploy/validate.py --printed "$tmp" || bad "deploy/validate.py --printed"
else
  bad "deploy/validate.py wrote no broker pods ($tmp/pods.list)"
fi

# ---- systemd ----------------------------------------------------------------------------------
for name in hasync.service hasync-controller.service; do
  step "systemd-analyze verify / security: deploy/systemd/$name"
  # verify checks that ExecStart's binary exists: check a copy pointing at the binary just built.
  unit="$tmp/$name"
  sed "s#/usr/local/bin/hasync#$hasync#g" "deploy/systemd/$name" > "$unit"
  if out=$(systemd-analyze verify --man=no "$unit" 2>&1) && [ -z "$out" ]; then
    echo "ok: verify"
  else
    echo "$out"
    bad "systemd-analyze verify $name (warnings count as failures)"
  fi
  # --threshold is in tenths: 20 = an overall exposure of 2.0 (hasync.service: 1.2).
  if out=$(systemd-analyze security --offline=yes --threshold=20 "$unit" 2>&1); then
    echo "ok: $(echo "$out" | grep -i 'overall exposure')"
  else
    echo "$out" | tail -5
    bad "systemd-analyze security $name (exposure above 2.0)"
  fi
done

# ---- prometheus -------------------------------------------------------------------------------
step "promtool check rules / test rules"
promtool check rules deploy/prometheus/rules.yml || bad "promtool check rules"
promtool test rules deploy/prometheus/rules_test.yml || bad "promtool test rules"

# ---- kubernetes -------------------------------------------------------------------------------
step "kubernetes-validate --strict"
"$venv/bin/kubernetes-validate" --strict deploy/kubernetes/*.yaml || bad "kubernetes-validate"

# ---- grafana ----------------------------------------------------------------------------------
step "grafana dashboard is JSON"
"$venv/bin/python" -m json.tool deploy/grafana/hasync.json >/dev/null \
  && echo "ok: deploy/grafana/hasync.json" || bad "deploy/grafana/hasync.json is not JSON"

echo
if [ "$fail" != 0 ]; then
  echo "deploy/validate.sh: FAILED ($(( $(date +%s) - started ))s)"
  exit 1
fi
echo "deploy/validate.sh: all checks passed ($(( $(date +%s) - started ))s)"
