"""`tests/chaos/run --failover-bench [--runs N] [--ttl 3s,10s]`: the coordinator's figures.

For each TTL: coord-kill-master with seeds 1..N (the time from the kill -9 of the master to the
first PUT_OK on the new master, as the clients logged it) and coord-switchover-under-load with
seeds 1..--switchover-runs (two switchovers each: the write pause the CLI reports, and the
longest gap between PUT_OKs the clients saw around it). Every run is checked as usual (the
checker and the scenario's expectations); a failing run is listed and counts as a failure, its
figures are still shown. Prints one table; writes bench.json in the output directory.
"""

import json
import os
import statistics
import time


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(round(p / 100 * (len(v) - 1)))))
    return v[k]


def fmt(v, unit="s"):
    if v is None:
        return "-"
    return f"{v:.2f}{unit}" if unit == "s" else f"{v:.0f}{unit}"


def figures_of(run_dir):
    try:
        with open(os.path.join(run_dir, "figures.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def run(args, out, binary, run_child):
    ttls = [t.strip() for t in (args.ttl or "3s").split(",") if t.strip()]
    t0 = time.time()
    rows, failed, report = [], [], {"ttls": {}}
    for ttl in ttls:
        sub = os.path.join(out, f"ttl-{ttl}")
        os.makedirs(sub, exist_ok=True)
        fail_s, pauses, gaps = [], [], []
        plan = [("coord-kill-master", s) for s in range(1, args.runs + 1)]
        plan += [("coord-switchover-under-load", s) for s in range(1, args.switchover_runs + 1)]
        for name, seed in plan:
            print(f"ttl {ttl}: running {name} seed {seed} ...", flush=True)
            r = run_child(name, seed, sub, binary, args.keep, ttl)
            if not r["passed"]:
                failed.append(f'{name} seed {seed} (ttl {ttl}): {r["dir"]} '
                              f'{r.get("failed_expectations") or ""}')
            fig = figures_of(r["dir"])
            for f in fig.get("failovers", []):
                if f.get("failover_s") is not None:
                    fail_s.append(f["failover_s"])
            for f in fig.get("switchovers", []):
                if f.get("reported_pause_ms") is not None:
                    pauses.append(f["reported_pause_ms"])
                if f.get("client_gap_s") is not None:
                    gaps.append(f["client_gap_s"])
        report["ttls"][ttl] = {"failover_s": fail_s, "switchover_pause_ms": pauses,
                               "switchover_client_gap_s": gaps}
        rows.append((ttl, fail_s, pauses, gaps))
    print()
    head = (f'{"ttl":>5} {"kills":>5} {"failover p50":>12} {"max":>7} {"mean":>7} {"goal":>6}  '
            f'{"switchovers":>11} {"pause p50":>9} {"max":>7} {"client gap p50":>14} {"max":>7}')
    print(head)
    print("-" * len(head))
    for ttl, fail_s, pauses, gaps in rows:
        from .coord import parse_seconds

        goal = parse_seconds(ttl) + 2
        mean = statistics.mean(fail_s) if fail_s else None
        print(f"{ttl:>5} {len(fail_s):>5} {fmt(pct(fail_s, 50)):>12} {fmt(max(fail_s, default=None)):>7} "
              f"{fmt(mean):>7} {fmt(goal):>6}  {len(pauses):>11} {fmt(pct(pauses, 50), 'ms'):>9} "
              f"{fmt(max(pauses, default=None), 'ms'):>7} {fmt(pct(gaps, 50)):>14} "
              f"{fmt(max(gaps, default=None)):>7}")
    print("\nfailover: kill -9 of the master to the first PUT_OK on the new master (clients' view);"
          "\npause: the write pause `hasync switchover` reports; client gap: the longest time "
          "without a PUT_OK around it")
    report["failed"] = failed
    with open(os.path.join(out, "bench.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"\n{len(failed)} failed run(s) in {time.time() - t0:.0f} s; output in {out}")
    for line in failed:
        print("  FAIL", line)
    return 1 if failed else 0
