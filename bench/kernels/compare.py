#!/usr/bin/env python3
"""Two `osprey bench-kernels --out` reports side by side: per (solution, definition, workload) the
gate of each and the median times, B over A (below 1: B is faster). When the two reports ran other
solutions (one each: cpu vs cpu-exact, cpu vs cuda), rows pair by (definition, workload) alone.
Workloads present in only one report, and hidden workloads whose dimensions differ (another --seed),
are listed apart. A ratio of medians by two clocks ("clock": device vs wall) is marked '*'.

usage: bench/kernels/compare.py A.json B.json"""
import json
import sys


def rows(path, by_solution):
    r = json.load(open(path))
    out = {}
    for res in r["results"]:
        for w in res["workloads"]:
            sol = res["solution"] if by_solution else "*"
            out[(sol, res["definition"], w.get("workload", w.get("status", "?")))] = w
    return r, out


def ceilings(r):
    """the ceilings the report's children measured (the median over its timings), or "" (older reports,
    --gate-only): B/A ratios compare like with like only when these agree"""
    def med(key):
        v = sorted(w["timing"][key] for res in r["results"] for w in res["workloads"]
                   if w.get("timing", {}).get(key, 0) > 0)
        return v[len(v) // 2] if v else None
    bw, gemm = med("copy_gbps"), med("gemm_gflops")
    out = f", copy {bw:.0f} GB/s" if bw else ""
    return out + (f", GEMM {gemm:.0f} GFLOP/s" if gemm else "")


def solutions(path):
    return {res["solution"] for res in json.load(open(path))["results"]}


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    by_solution = solutions(sys.argv[1]) == solutions(sys.argv[2])
    (ra, a), (rb, b) = rows(sys.argv[1], by_solution), rows(sys.argv[2], by_solution)
    if not by_solution:
        print(f"solutions: A {sorted(solutions(sys.argv[1]))}, B {sorted(solutions(sys.argv[2]))}")
    for name, r in (("A", ra), ("B", rb)):
        print(f"{name}: commit {r['commit']}, {r['compiler']}, {r['host_cpu']}, seed {r['seed']}{ceilings(r)}")
    print(f"{'solution':10} {'definition':24} {'workload':28} {'gate A':>11} {'gate B':>11} {'A us':>10} {'B us':>10} {'B/A':>6}")
    only = []
    for key in sorted(set(a) | set(b)):
        wa, wb = a.get(key), b.get(key)
        if not wa or not wb or wa.get("dims") != wb.get("dims"):
            only.append(key)
            continue
        ta, tb = wa.get("timing", {}).get("median_us"), wb.get("timing", {}).get("median_us")
        # medians by two clocks (device vs wall, or a report from before the clock field) are marked '*'
        ca, cb = wa.get("timing", {}).get("clock", "wall"), wb.get("timing", {}).get("clock", "wall")
        ratio = f"{tb / ta:5.2f}{'*' if ca != cb else ' '}" if ta and tb else f"{'-':>6}"
        fa = f"{ta:10.2f}" if ta else f"{'-':>10}"
        fb = f"{tb:10.2f}" if tb else f"{'-':>10}"
        print(f"{key[0]:10} {key[1]:24} {key[2]:28} {wa.get('gate', wa.get('status')):>11} "
              f"{wb.get('gate', wb.get('status')):>11} {fa} {fb} {ratio}")
    print("B/A marked '*': the two medians are by different clocks (device time of the kernels vs wall time "
          "around each run): not comparable")
    if only:
        print(f"in one report only, or other dimensions: {len(only)}")
        for k in only[:40]:
            print("  ", *k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
