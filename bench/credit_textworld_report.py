"""The summary and table of ``bench/bench_credit.py --env textworld`` (``credit_textworld``): per arm the
end success (mean and 95 % t interval over seeds), the AUC of the rollout success curve, the paired
difference against ``outcome`` with its two-sided paired t-test p-value, wall time per step, the mean |A|
over loss tokens (``|A|``: the size of update a credit mode asks for at a given lr), and gigpo's
anchor-group statistics.

``python bench/credit_textworld_report.py FILE [FILE ...] [--base ARM]`` prints the table of several
result files together (e.g. outcome at a second lr, made by its own ``--lr`` run, paired by seed
against gigpo's file); arms are named with the workload fields in which their files differ."""

from __future__ import annotations

import math
import statistics


def t_interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its two-sided 95 % t interval (0 for one value)."""
    from scipy import stats

    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def paired_p(d: list[float]) -> float | None:
    """Two-sided paired t-test p-value of the differences ``d`` (None: fewer than 2, or all equal)."""
    from scipy import stats

    if len(d) < 2 or statistics.pstdev(d) == 0:
        return None
    return float(stats.ttest_1samp(d, 0.0).pvalue)


def summarize(runs: list[dict], arms: list[str], base: str = "outcome") -> dict:
    """Per arm (a run's ``arm`` label) its figures; each other arm paired by seed against ``base``
    (``vs_base``: the end and AUC differences, their p-values, the seeds ahead and behind)."""
    out = {}
    for arm in arms:
        mine = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        ends = [r["end_success"] for r in mine]
        aucs = [statistics.fmean(r["reward"]) for r in mine]
        m, ci = t_interval(ends)
        shared = [c.get("credit/anchor_turns_shared") for r in mine for c in r["credit"]]
        biggest = [c.get("credit/anchor_group_size_max") for r in mine for c in r["credit"]]
        groups = [c.get("credit/anchor_groups") for r in mine for c in r["credit"]]
        sizes = [c.get("credit/adv_abs_mean") for r in mine for c in r["credit"]]  # absent in older runs
        out[arm] = {
            "seeds": [r["seed"] for r in mine],
            "end_success_per_seed": ends,
            "end_success": m,
            "end_success_ci95": ci,
            "auc_per_seed": aucs,
            "auc": statistics.fmean(aucs),
            "step_s": statistics.median(s for r in mine for s in r["step_s"])
            if any(r["step_s"] for r in mine)
            else None,
            "mean_curve": [statistics.fmean(c) for c in zip(*(r["reward"] for r in mine))],
            "anchor_turns_shared_mean": statistics.fmean(shared) if None not in shared and shared else None,
            "anchor_groups_mean": statistics.fmean(groups) if None not in groups and groups else None,
            "anchor_group_size_max": max(biggest) if None not in biggest and biggest else None,
            "adv_abs_mean": statistics.fmean(sizes) if None not in sizes and sizes else None,
        }
    if base in out:
        ref = out[base]
        for arm in arms:
            if arm == base:
                continue
            mine, theirs = (
                dict(zip(x["seeds"], zip(x["end_success_per_seed"], x["auc_per_seed"]))) for x in (out[arm], ref)
            )
            both = [s for s in mine if s in theirs]  # paired by seed: the seeds both arms ran
            if not both:
                continue
            d = [mine[s][0] - theirs[s][0] for s in both]
            da = [mine[s][1] - theirs[s][1] for s in both]
            out[arm]["vs_base"] = {
                "base": base,
                "seeds_paired": len(both),
                "end_diff": statistics.fmean(d),
                "end_diff_ci95": t_interval(d)[1],
                "end_p": paired_p(d),
                "seeds_ahead": sum(x > 0 for x in d),
                "seeds_behind": sum(x < 0 for x in d),
                "auc_diff": statistics.fmean(da),
                "auc_p": paired_p(da),
            }
    return out


def scored(args) -> str:
    """What the eval scores: unseen worlds (``--eval-split eval``) or the ``--worlds`` practised ones."""
    return "held-out" if args.eval_split == "eval" else f"practised-worlds ({args.worlds})"


def report(summary: dict, arms: list[str], start: dict, args) -> None:
    n = len(summary[arms[0]]["seeds"])
    print(
        f"\ntextworld difficulty {args.difficulty}, {args.max_turns} turns, {args.groups}x{args.group_size} "
        f"episodes/step, {args.steps} steps, {n} seeds; start {scored(args)} success "
        f"{start.get('solve_rate', float('nan')):.3f} on {args.eval_tasks} eval tasks"
    )
    w = max(12, 2 + max(len(a) for a in arms))
    base = next((v["base"] for s in summary.values() if (v := s.get("vs_base"))), "outcome")
    head = (
        f"{'arm':<{w}}{'end success':>16}{'AUC':>8}{'diff vs ' + base:>{max(22, len(base) + 12)}}{'p':>8}{'ahead':>7}"
    )
    print(f"{head}{'AUC diff':>10}{'p':>8}{'s/step':>8}{'|A|':>7}")
    for arm in arms:
        s = summary[arm]
        v = s.get("vs_base")
        diff = f"{v['end_diff']:+.3f} +- {v['end_diff_ci95']:.3f}" if v else "-"
        p = f"{v['end_p']:.3f}" if v and v["end_p"] is not None else "-"
        ahead = f"{v['seeds_ahead']}/{v['seeds_paired']}" if v else "-"
        auc_diff = f"{v['auc_diff']:+.3f}" if v else "-"
        auc_p = f"{v['auc_p']:.3f}" if v and v["auc_p"] is not None else "-"
        print(
            f"{arm:<{w}}{s['end_success']:>8.3f} +- {s['end_success_ci95']:.3f}{s['auc']:>8.3f}"
            f"{diff:>{max(22, len(base) + 12)}}{p:>8}"
            f"{ahead:>7}{auc_diff:>10}{auc_p:>8}{(s['step_s'] or 0):>8.1f}"
            + (f"{s['adv_abs_mean']:>7.3f}" if s["adv_abs_mean"] is not None else f"{'-':>7}")
        )
    for arm in arms:
        g = summary[arm]
        if arm.startswith("gigpo") and g["anchor_groups_mean"] is not None:
            print(
                f"  {arm} anchors per step: {g['anchor_groups_mean']:.1f} groups, {g['anchor_turns_shared_mean']:.1f} "
                f"turns in groups of size > 1, largest group {g['anchor_group_size_max']}"
            )


def combined(paths: list[str], base: str | None) -> tuple[dict, list[str]]:
    """The runs of several result files in one summary. An arm keeps its name when every file shares
    one workload, else it is named with the workload fields that differ (``outcome lr=4.2e-05``)."""
    import json
    from pathlib import Path

    files = [json.loads(Path(p).read_text()) for p in paths]
    keys = {k for f in files for k in f["workload"]}
    differ = sorted(k for k in keys if len({json.dumps(f["workload"].get(k)) for f in files}) > 1)
    runs, arms = [], []
    for f in files:
        tag = " ".join(f"{k}={f['workload'].get(k)}" for k in differ)
        for r in f["runs"]:
            label = f"{r['arm']} {tag}".strip()
            runs.append({**r, "arm": label})
            arms += [label] if label not in arms else []
    if base is not None and base not in arms:
        raise SystemExit(f"--base {base!r} is none of the arms {arms}")
    return summarize(runs, arms, base or arms[0]), arms


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="the table of several bench_credit.py --env textworld result files")
    ap.add_argument("files", nargs="+", help="result JSON files (bench/results/credit-textworld*.json)")
    ap.add_argument("--base", default=None, help="the arm the others are paired against (default: the first)")
    args = ap.parse_args()
    import json
    from pathlib import Path

    first = json.loads(Path(args.files[0]).read_text())
    summary, arms = combined(args.files, args.base)
    report(summary, arms, first.get("start") or {}, argparse.Namespace(**first["workload"]))


if __name__ == "__main__":
    main()
