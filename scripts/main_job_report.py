#!/usr/bin/env python3
"""The main job's verdict: held-out pass@1 before and after GRPO, with 95 % Wilson intervals, and a PNG.

Reads the two per-task reports ``lego tasks screen --report`` wrote (fresh rollouts of the SFT checkpoint and of
the GRPO checkpoint, none of them trained on) and the GRPO run's ``metrics.jsonl``, prints per task and pooled
``solved/attempts = rate [low, high]`` before and after, what the GRPO stage did (steps that trained, optimizer
steps, the weight version the engine ended on, whether its rows carry consistency figures), and writes a bar
chart with the intervals to ``--png`` (matplotlib, the ``plots`` extra that ``make run`` installs).

    .venv/bin/python scripts/main_job_report.py --before runs/main-X/eval-before.jsonl \\
        --after runs/main-X/eval-after.jsonl --grpo runs/main-X/grpo --png runs/main-X/pass_at_1.png

Exit status 0 when both reports hold every task with attempts; 1 when one is missing, empty or short of
attempts (the figures would not be what they claim); 2 when matplotlib is missing (the figures are printed
first).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Z95 = 1.959964
"""The standard normal's 97.5 % quantile: a two-sided 95 % interval."""


def wilson_interval(solved: int, attempts: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial rate. Unlike the normal approximation it stays inside [0, 1] and is
    not zero-width at 0/k or k/k, which is where a small k of a tiny model's rollouts usually lands."""
    if attempts <= 0 or not 0 <= solved <= attempts:
        raise ValueError(f"solved={solved} of attempts={attempts} is not a rate")
    p = solved / attempts
    denom = 1 + z * z / attempts
    centre = (p + z * z / (2 * attempts)) / denom
    half = z * math.sqrt(p * (1 - p) / attempts + z * z / (4 * attempts * attempts)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Rate:
    solved: int
    attempts: int

    @property
    def value(self) -> float:
        return self.solved / self.attempts

    def text(self) -> str:
        low, high = wilson_interval(self.solved, self.attempts)
        return f"{self.solved:>2}/{self.attempts:<2} = {self.value:4.0%} [{low:4.0%}, {high:4.0%}]"


def read_report(path: Path, k: int) -> dict[str, Rate]:
    """Per task ``Rate`` from a screen report; a missing file, a bad row or a task short of ``k`` attempts is an
    error naming the file and the task."""
    if not path.is_file():
        raise SystemExit(f"main_job_report: {path} does not exist (did the evaluation stage run?)")
    rates: dict[str, Rate] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        ident, attempts = row["instance_id"], int(row["attempts"])
        if attempts < k:
            raise SystemExit(f"main_job_report: {path}:{lineno}: {ident} has {attempts} of {k} attempts "
                             f"({row.get('decision')}; lost to the infrastructure: {row.get('infrastructure_reasons')})")
        rates[ident] = Rate(int(row["solved"]), attempts)
    if not rates:
        raise SystemExit(f"main_job_report: {path} holds no task")
    return rates


def pooled(rates: dict[str, Rate]) -> Rate:
    return Rate(sum(r.solved for r in rates.values()), sum(r.attempts for r in rates.values()))


def grpo_facts(run_root: Path) -> dict[str, Any]:
    """What the GRPO stage did, from its metrics rows (the run store's record, not the job's own claims)."""
    path = run_root / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    values = [r["values"] for r in rows]
    return {
        "steps": len(rows),
        "trained_steps": sum(1 for v in values if v.get("trained") == 1.0),
        "optimizer_steps": int(sum(v.get("optimizer_steps", 0.0) for v in values)),
        "weight_version": int(values[-1].get("weight_version", 0)) if values else 0,
        "solve_rate_per_step": [v.get("solve_rate") for v in values],
        "rows_with_consistency": sum(1 for v in values if any(k.startswith("consistency/") for k in v)),
    }


def plot(before: dict[str, Rate], after: dict[str, Rate], png: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print("main_job_report: no plot: matplotlib is missing (pip install -e '.[plots]')", file=sys.stderr)
        raise SystemExit(2) from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    names = [*sorted(before), "all tasks"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for shift, label, rates in ((-0.18, "before GRPO (SFT)", before), (0.18, "after GRPO", after)):
        rs = [rates[n] for n in names[:-1]] + [pooled(rates)]
        ys = [r.value for r in rs]
        lows, highs = zip(*(wilson_interval(r.solved, r.attempts) for r in rs), strict=True)
        err = [[y - lo for y, lo in zip(ys, lows, strict=True)], [hi - y for y, hi in zip(ys, highs, strict=True)]]
        ax.bar([i + shift for i in range(len(names))], ys, width=0.34, yerr=err, capsize=4, label=label)
    ax.set_xticks(range(len(names)), [n.removeprefix("lego-example-") for n in names])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out pass@1 (95 % Wilson)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="screen report of the SFT checkpoint")
    ap.add_argument("--after", type=Path, required=True, help="screen report of the GRPO checkpoint")
    ap.add_argument("--grpo", type=Path, required=True, help="the GRPO run directory")
    ap.add_argument("--png", type=Path, required=True, help="the plot to write")
    ap.add_argument("-k", type=int, default=1, help="attempts each task must have")
    args = ap.parse_args(argv)
    before, after = read_report(args.before, args.k), read_report(args.after, args.k)
    if set(before) != set(after):
        raise SystemExit(f"main_job_report: the reports hold different tasks: {sorted(before)} vs {sorted(after)}")
    facts = grpo_facts(args.grpo)
    print(f"GRPO stage: steps {facts['steps']}, trained {facts['trained_steps']} (optimizer steps "
          f"{facts['optimizer_steps']}), engine weights at version {facts['weight_version']}, metrics rows with "
          f"consistency figures {facts['rows_with_consistency']}; on-policy solve rate per step "
          + " ".join("-" if s is None else f"{s:.2f}" for s in facts["solve_rate_per_step"]))
    print("held-out pass@1, fresh rollouts not trained on (95 % Wilson interval):")
    print(f"  {'task':<24} {'before GRPO (SFT checkpoint)':<30} after GRPO")
    for name in sorted(before):
        print(f"  {name:<24} {before[name].text():<30} {after[name].text()}")
    pb, pa = pooled(before), pooled(after)
    print(f"  {'all tasks':<24} {pb.text():<30} {pa.text()}")
    title = (f"main job: held-out pass@1, k={min(r.attempts for r in before.values())} per task; "
             f"GRPO steps {facts['steps']}, trained {facts['trained_steps']}")
    plot(before, after, args.png, title)
    print(f"plot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
