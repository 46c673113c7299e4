#!/usr/bin/env python3
"""Compares two lm-eval runs of the same multiple-choice task, item by item (run.sh's last step).

Reads each run's --log_samples file (samples_<task>_*.jsonl under its output directory): per item the
loglikelihood lm-eval got for each option. Prints, per backend, acc and acc_norm (recomputed here the
way lm-eval computes them, argmax of the loglikelihood, and of the loglikelihood over the option's
length in characters for acc_norm, and checked against lm-eval's own per-item flags); then how often the two
backends pick the same option; the per-option loglikelihood differences (max and mean of |a - b|); and
each item where the picks differ, with each backend's gap between its pick and the other's pick
(a near-tie when small); the smallest lead of the first option over the second under A (how near the
nearest tie was); and how often lm-eval's is_greedy flags agree. Writes the same as JSON with --json FILE.
Exit status 1 when the runs disagree beyond float noise: a pick that differs where A's pick leads by
more than --near-tie (0.05 nats), or an option whose loglikelihoods differ by more than --max-diff
(0.1 nats; osprey's Q8 activations against float give about 0.01 on SmolLM2, RESULTS.md).
Usage: compare.py --a NAME=DIR --b NAME=DIR [--json FILE] [--near-tie X] [--max-diff X]
"""
import argparse
import glob
import json
import os
import sys


def load_samples(d):
    files = sorted(glob.glob(os.path.join(d, "**", "samples_*.jsonl"), recursive=True))
    if not files:
        sys.exit(f"compare: no samples_*.jsonl under {d} (was lm_eval run with --log_samples?)")
    items = {}
    with open(files[-1], encoding="utf-8") as f:
        for line in f:
            s = json.loads(line)
            # one response per option: [loglikelihood, is_greedy] (numbers may be strings in some versions)
            lls = [float(r[0]) for r in s["filtered_resps"]]
            greedy = [str(r[1]) == "True" for r in s["filtered_resps"]]
            choices = s["doc"]["choices"]
            if len(lls) != len(choices):
                sys.exit(f"compare: {files[-1]} doc {s['doc_id']}: {len(lls)} loglikelihoods for {len(choices)} choices")
            items[s["doc_id"]] = {"lls": lls, "greedy": greedy, "choices": choices, "target": int(s["target"]),
                                  "acc": float(s["acc"]), "acc_norm": float(s["acc_norm"])}
    return files[-1], items


def argmax(xs):
    return max(range(len(xs)), key=lambda i: xs[i])


def picks(it):
    lls = it["lls"]
    norm = [ll / len(c) for ll, c in zip(lls, it["choices"])]
    return argmax(lls), argmax(norm)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="NAME=DIR (the reference, e.g. hf=out-hf)")
    ap.add_argument("--b", required=True, help="NAME=DIR (e.g. osprey=out-osprey)")
    ap.add_argument("--json")
    ap.add_argument("--near-tie", type=float, default=0.05)
    ap.add_argument("--max-diff", type=float, default=0.1)
    args = ap.parse_args()
    (na, da), (nb, db) = (x.split("=", 1) for x in (args.a, args.b))
    fa, A = load_samples(da)
    fb, B = load_samples(db)
    if sorted(A) != sorted(B):
        sys.exit(f"compare: the runs scored different items ({len(A)} vs {len(B)})")
    ids = sorted(A)
    out = {"items": len(ids), "files": {na: fa, nb: fb}, "backends": {}}
    for name, R in ((na, A), (nb, B)):
        acc = sum(picks(R[i])[0] == R[i]["target"] for i in ids) / len(ids)
        acc_norm = sum(picks(R[i])[1] == R[i]["target"] for i in ids) / len(ids)
        lm_acc = sum(R[i]["acc"] for i in ids) / len(ids)
        lm_acc_norm = sum(R[i]["acc_norm"] for i in ids) / len(ids)
        out["backends"][name] = {"acc": acc, "acc_norm": acc_norm, "lm_eval_acc": lm_acc, "lm_eval_acc_norm": lm_acc_norm}
        print(f"{name:>8}: acc {acc:.4f}  acc_norm {acc_norm:.4f}  (lm-eval's own: {lm_acc:.4f} / {lm_acc_norm:.4f})")
    diffs = [abs(a - b) for i in ids for a, b in zip(A[i]["lls"], B[i]["lls"])]
    same = sum(picks(A[i])[0] == picks(B[i])[0] for i in ids)
    same_norm = sum(picks(A[i])[1] == picks(B[i])[1] for i in ids)
    out.update({"same_pick_acc": same, "same_pick_acc_norm": same_norm, "n_options": len(diffs),
                "ll_abs_diff_max": max(diffs), "ll_abs_diff_mean": sum(diffs) / len(diffs)})
    print(f"same option picked: {same}/{len(ids)} (acc), {same_norm}/{len(ids)} (acc_norm)")
    print(f"per-option loglikelihood |{na} - {nb}|: max {max(diffs):.4f}  mean {sum(diffs) / len(diffs):.4f} "
          f"over {len(diffs)} options")
    margins = sorted((sorted(A[i]["lls"])[-1] - sorted(A[i]["lls"])[-2], i) for i in ids)
    greedy_same = sum(ga == gb for i in ids for ga, gb in zip(A[i]["greedy"], B[i]["greedy"]))
    out.update({"nearest_tie_" + na: {"doc_id": margins[0][1], "lead": margins[0][0]},
                "items_lead_below_0.1_" + na: sum(m < 0.1 for m, _ in margins), "is_greedy_same": greedy_same})
    print(f"nearest tie under {na}: item {margins[0][1]}, lead {margins[0][0]:.4f} nats; "
          f"{sum(m < 0.1 for m, _ in margins)} items lead by < 0.1")
    print(f"is_greedy flags equal: {greedy_same}/{len(diffs)}")
    out["disagreements"] = []
    bad = max(diffs) > args.max_diff
    for i in ids:
        for k, kind in ((0, "acc"), (1, "acc_norm")):
            pa, pb = picks(A[i])[k], picks(B[i])[k]
            if pa == pb:
                continue
            la, lb = A[i]["lls"], B[i]["lls"]
            scale = [1.0] * len(la) if k == 0 else [float(len(c)) for c in A[i]["choices"]]
            gap_a = la[pa] / scale[pa] - la[pb] / scale[pb]  # how far A's pick leads B's pick under A
            gap_b = lb[pb] / scale[pb] - lb[pa] / scale[pa]
            d = {"doc_id": i, "kind": kind, na: A[i]["choices"][pa], nb: B[i]["choices"][pb],
                 f"gap_{na}": gap_a, f"gap_{nb}": gap_b}
            out["disagreements"].append(d)
            bad = bad or gap_a > args.near_tie
            print(f"  item {i} ({kind}): {na} picks {A[i]['choices'][pa]!r} by {gap_a:.4f}, "
                  f"{nb} picks {B[i]['choices'][pb]!r} by {gap_b:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print("compare: " + ("DISAGREE beyond near-ties / float noise" if bad else "agree (within near-ties and float noise)"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
