"""tests/chaos/run: the fault-injection harness's command line.

    tests/chaos/run --smoke                      the CI subset (and the negative controls), its
                                                 load phases at half length (--load-scale 0.5)
    tests/chaos/run --all --seeds N              every scenario with seeds 1..N
    tests/chaos/run --scenario NAME --seed S     one scenario (replay a failing seed)
    tests/chaos/run --check RUN_DIR...           the checker again on kept run directories
    tests/chaos/run --list                       the scenarios
    tests/chaos/run --failover-bench [--runs 20] [--ttl 3s,10s]
                                                 failover and switchover figures (coordinator)

Each (scenario, seed) runs in a child process of its own (its namespaces, its processes, its
gRPC threads), bounded in time; the parent sweeps whatever a killed child left behind, runs
the synthetic negative controls, and prints the table. Exit 1 when any verdict fails.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from . import coord as coordmod
from . import layout
from . import net as netmod

CHILD_TIMEOUT = 240
SMOKE_LOAD_SCALE = 0.5


def sweep_mounts():
    """Unmounts tmpfs mounts of harness runs whose process is gone."""
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return
    for src, target, *_ in mounts:
        if src.startswith(netmod.BASE) and "-" in src:
            pid = src[len(netmod.BASE):].split("-")[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                netmod.sh("umount", "-l", target, check=False)


def child(args):
    """One scenario run, inside its own namespaces (entered before any gRPC thread exists)."""
    net = netmod.Net(layout.nodes_of(args.scenario), layout.extras_of(args.scenario))

    def on_term(signum, frame):
        # once: the cleanup below must not be interrupted by a second signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    run_dir = None
    try:
        net.create()
        netmod.enter(net.ns("cl"))
        from . import scenarios  # gRPC channels are opened only now, inside the namespace

        scenarios.LOAD_SCALE = args.load_scale or 1.0

        overrides = {"ttl": args.ttl} if args.ttl else None
        run_dir = scenarios.run_scenario(args.scenario, args.seed, args.out, args.binary, net,
                                         overrides)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            net.heal()
        finally:
            net.close()
    from . import checker

    verdict = checker.check(run_dir)
    return 0 if verdict["verdict"] == "pass" else 1


def run_child(scenario, seed, out, binary, keep, ttl=None, load_scale=None):
    cmd = [sys.executable, "-m", "chaos.main", "--child", "--scenario", scenario,
           "--seed", str(seed), "--out", out, "--binary", binary]
    if ttl:
        cmd += ["--ttl", ttl]
    if load_scale:
        cmd += ["--load-scale", str(load_scale)]
    run_dir = os.path.join(out, f"{scenario}-s{seed}")
    # a verdict counts only if this child wrote it: nothing of an earlier run may remain
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.time()
    log_path = os.path.join(out, f"{scenario}-s{seed}.out")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        try:
            code = proc.wait(CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(10)
            code = f"timeout after {CHILD_TIMEOUT}s"
    netmod.sweep_stale()
    sweep_mounts()
    coordmod.sweep_etcd_dirs()
    elapsed = time.time() - t0
    verdict = None
    vpath = os.path.join(run_dir, "verdict.json")
    if code in (0, 1) and os.path.exists(vpath):
        with open(vpath) as f:
            verdict = json.load(f)
    # a coordinator scenario's own expectations (expectations.json) must hold too
    failed_expectations = None
    epath = os.path.join(run_dir, "expectations.json")
    if os.path.exists(epath):
        with open(epath) as f:
            failed_expectations = [e["name"] for e in json.load(f) if not e["ok"]]
    passed = bool(verdict and verdict["verdict"] == "pass" and not failed_expectations)
    if passed and not keep:
        shutil.rmtree(os.path.join(run_dir, "data"), ignore_errors=True)
    return {"scenario": scenario, "seed": seed, "code": code, "verdict": verdict,
            "failed_expectations": failed_expectations, "passed": passed,
            "elapsed": elapsed, "log": log_path, "dir": run_dir}


W = 36  # the first column: scenario names and "synthetic:<control>"
COUNT_COLUMNS = (("PUT_OK", "PUT_OK"), ("FST", "FLUSH_SLAVE_TIMEOUT"), ("SNA", "SLAVE_NOT_AVAILABLE"),
                 ("FDT", "FLUSH_DISK_TIMEOUT"), ("fail", "fail"), ("unk", "unknown"))


def fmt_counts(v):
    return " ".join(f"{v['counts'].get(key, 0):>{len(h) if len(h) > 4 else 5}}" for h, key in COUNT_COLUMNS)


def print_table(results, synthetic):
    counts_head = " ".join(f"{h:>{len(h) if len(h) > 4 else 5}}" for h, _ in COUNT_COLUMNS)
    head = f'{"scenario":{W}} {"seed":>4} {counts_head:>24} {"anomalies":28} {"unavail s":>9} {"conv s":>6} {"time":>5}  verdict'
    print(head)
    print("-" * len(head))
    failed = 0
    for r in results:
        v = r["verdict"]
        if v is None:
            failed += 1
            print(f'{r["scenario"]:{W}} {r["seed"]:>4} {"-":>24} {"(no verdict: " + str(r["code"]) + ")":28} {"-":>9} {"-":>6} {r["elapsed"]:5.0f}  FAIL  see {r["log"]}')
            continue
        kinds = {}
        for a in v["anomalies"]:
            kinds[a["kind"]] = kinds.get(a["kind"], 0) + a.get("count", 1)
        an = ",".join(f"{k}:{n}" for k, n in sorted(kinds.items())) or "none"
        if v.get("expect"):
            an = f'{an} (expected {",".join(v["expect"])})'
        bad = r.get("failed_expectations")
        if bad:
            an = f"{an}; expectation failed: {'; '.join(bad)}"
        un = v.get("unavailability") or {}
        conv = v.get("converge_s")
        ok = v["verdict"] == "pass" and not bad
        failed += 0 if ok else 1
        print(f'{r["scenario"]:{W}} {r["seed"]:>4} {fmt_counts(v):>24} {an:28} '
              f'{un.get("longest_s", 0):9.1f} {conv if conv is None else round(conv, 1)!s:>6} '
              f'{r["elapsed"]:5.0f}  {"pass" if ok else "FAIL  " + r["dir"]}')
    for s in synthetic:
        failed += 0 if s["ok"] else 1
        print(f'{"synthetic:" + s["name"]:{W}} {"-":>4} {"-":>24} '
              f'{",".join(s["found_kinds"]) or "none":28} {"-":>9} {"-":>6} {"-":>5}  '
              f'{"pass" if s["ok"] else "FAIL (expected " + ",".join(s["expected"]) + ")"}')
    return failed


def scenario_names(smoke=False):
    from .scenarios import SCENARIOS

    return [n for n, spec in SCENARIOS.items() if spec.get("smoke") or not smoke]


def main():
    from .scenarios import SCENARIOS

    p = argparse.ArgumentParser(prog="tests/chaos/run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--smoke", action="store_true", help="the CI subset and every negative control")
    g.add_argument("--all", action="store_true", help="every scenario")
    g.add_argument("--scenario", help="one scenario (see --list)")
    g.add_argument("--replay", metavar="RUN_DIR",
                   help="run a kept run's scenario and seed again (its run.json)")
    g.add_argument("--check", nargs="+", metavar="RUN_DIR", help="re-check kept run directories")
    g.add_argument("--list", action="store_true")
    p.add_argument("--seeds", type=int, default=1, help="seeds 1..N for --smoke/--all")
    p.add_argument("--seed", type=int, default=1, help="the seed for --scenario")
    p.add_argument("--out", help="output directory (default: a new /tmp/hasync-chaos-<time>)")
    p.add_argument("--binary", default=os.environ.get("HASYNC_BIN"))
    p.add_argument("--keep", action="store_true", help="keep the data dirs of passing runs too")
    p.add_argument("--load-scale", type=float,
                   help="the load phases' length relative to the full run's (before the first "
                        "fault, after the heal); default 1, 0.5 with --smoke")
    p.add_argument("--ttl", help="coordinator scenarios: coordinator.ttl (default 3s), e.g. 10s")
    p.add_argument("--failover-bench", action="store_true",
                   help="figures: coord-kill-master --runs times (and coord-switchover-under-load) "
                        "per --ttl value; prints p50/max of the failover time and the switchover pause")
    p.add_argument("--runs", type=int, default=20, help="runs per TTL for --failover-bench")
    p.add_argument("--switchover-runs", type=int, default=5,
                   help="coord-switchover-under-load runs per TTL for --failover-bench")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        sys.exit(child(args))
    if args.list:
        for name, spec in SCENARIOS.items():
            print(f'{name:{W}} {"[smoke] " if spec.get("smoke") else ""}{spec["doc"]}')
        return 0
    if args.check:
        from . import checker

        bad = 0
        for d in args.check:
            v = checker.check(d)
            print(f'{d}: {v["verdict"]} {[a["kind"] for a in v["anomalies"]]}')
            bad += v["verdict"] != "pass"
        return 1 if bad else 0
    if not args.binary or not os.path.exists(args.binary):
        p.error(f"the hasync binary {args.binary!r} does not exist (--binary or HASYNC_BIN)")
    if args.replay:
        with open(os.path.join(args.replay, "run.json")) as f:
            info = json.load(f)
        args.scenario, args.seed = info["scenario"], info["seed"]
        if args.load_scale is None:
            args.load_scale = info.get("load_scale")
    if args.load_scale is None and args.smoke:
        args.load_scale = SMOKE_LOAD_SCALE
    if args.load_scale is not None and not 0 < args.load_scale <= 10:
        p.error(f"--load-scale {args.load_scale}: give a factor in (0, 10]")
    if args.failover_bench:
        plan = None
    elif args.scenario:
        if args.scenario not in scenario_names():
            p.error(f"unknown scenario {args.scenario!r}; --list shows them")
        plan = [(args.scenario, args.seed)]
    elif args.smoke or args.all:
        # every scenario with every seed; a negative control once per suite (seed 1)
        plan = [(n, s) for s in range(1, args.seeds + 1)
                for n in scenario_names(smoke=args.smoke)
                if s == 1 or not SCENARIOS[n].get("control")]
    else:
        p.error("one of --smoke, --all, --scenario, --replay, --check, --list")
    if os.geteuid() != 0:
        raise SystemExit("the chaos harness needs root (network namespaces, tmpfs mounts)")
    out = args.out or f"/tmp/hasync-chaos-{time.strftime('%Y%m%d-%H%M%S')}"
    os.makedirs(out, exist_ok=True)
    out = os.path.abspath(out)
    if args.replay and os.path.abspath(args.replay) == os.path.join(out, f"{args.scenario}-s{args.seed}"):
        p.error("--replay would overwrite the run it replays: give another --out")
    binary = os.path.abspath(args.binary)
    netmod.sweep_stale()
    sweep_mounts()
    coordmod.sweep_etcd_dirs()
    if args.failover_bench:
        from . import bench

        return bench.run(args, out, binary, run_child)
    t0 = time.time()
    synthetic = []
    if args.smoke or args.all:
        from . import synthetic as synth

        synthetic = synth.run()
    results = []
    for name, seed in plan:
        print(f"running {name} seed {seed} ...", flush=True)
        results.append(run_child(name, seed, out, binary, args.keep, args.ttl, args.load_scale))
    print()
    failed = print_table(results, synthetic)
    print(f"\n{len(results)} run(s) and {len(synthetic)} synthetic control(s) in "
          f"{time.time() - t0:.0f} s; output in {out}; {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
