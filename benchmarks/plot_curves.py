"""Learning curves as PNG, from what the learning benchmarks write (matplotlib: ``pip install -e '.[plots]'``).

    python benchmarks/plot_curves.py toy toy_env_curves.csv benchmarks/results/evidence1_toy_env.png
    python benchmarks/plot_curves.py real runs/learning-real-X/summary.json benchmarks/results/evidence2_real.png

``toy``: ``benchmarks/train_toy_env.py --csv``'s rows (seed, run, step, reward_mean): mean reward per step, one line per
seed and run (grpo solid, control dashed). ``real``: ``benchmarks/learning_real_bench.py``'s ``summary.json``: the
solve rate per GRPO step of every seed and arm, the arms' mean across seeds in bold, the SFT'd starting rate as a
horizontal line. The figures say where the data came from in their title; nothing is smoothed.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

STYLE = {"grpo": ("tab:blue", "-"), "control": ("tab:gray", "--")}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_curves needs matplotlib: pip install -e '.[plots]'")
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_toy(src: Path, out: Path, title: str | None) -> None:
    curves: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    with src.open(newline="") as fh:
        for row in csv.DictReader(fh):
            curves[(row["run"], row["seed"])][int(row["step"])].append(float(row["reward_mean"]))
    if not curves:
        sys.exit(f"{src}: no rows (expected the columns seed, run, step, reward_mean)")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for (run, seed), by_step in sorted(curves.items()):
        steps = sorted(by_step)
        color, ls = STYLE.get(run, ("tab:red", ":"))
        ax.plot(steps, [statistics.mean(by_step[s]) for s in steps], color=color, linestyle=ls, marker="o",
                markersize=3, label=f"{run} seed {seed}")
    ax.set(xlabel="step", ylabel="mean reward", ylim=(-0.05, 1.05),
           title=f"first_letter, tiny model on CPU: GRPO vs zero-advantage control\n({title or src.name})")
    ax.axhline(0.9, color="tab:green", linewidth=0.8, linestyle=":")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def plot_real(src: Path, out: Path, title: str | None) -> None:
    summary = json.loads(src.read_text())
    arms = summary.get("arms") or []
    if not arms:
        sys.exit(f"{src}: no GRPO arms ran (summary.json has no 'arms')")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    by_arm: dict[str, list[list[float]]] = defaultdict(list)
    for a in arms:
        color, ls = STYLE.get(a["arm"], ("tab:red", ":"))
        ax.plot(range(len(a["rates"])), a["rates"], color=color, linestyle=ls, alpha=0.35, linewidth=1)
        by_arm[a["arm"]].append(a["rates"])
    for arm, runs in by_arm.items():
        n = min(len(r) for r in runs)
        color, ls = STYLE.get(arm, ("tab:red", ":"))
        ax.plot(range(n), [statistics.mean(r[i] for r in runs) for i in range(n)], color=color, linestyle=ls,
                linewidth=2.5, label=f"{arm}: mean of {len(runs)} seed(s)")
    start = summary.get("sft_rate")
    if start is not None:
        ax.axhline(start, color="tab:orange", linewidth=1, label=f"after SFT: {start:.0%}")
    args = summary.get("args", {})
    ax.set(xlabel="GRPO step", ylabel="solve rate (the step's group)", ylim=(-0.05, 1.05),
           title=f"{args.get('task', '?')} through Claude Code in bwrap, tiny model, group {args.get('group', '?')}"
                 f"\n({title or src.parent.name})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["toy", "real"])
    ap.add_argument("source", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--title", default=None, help="the figure's second title line (default: the source's name)")
    a = ap.parse_args()
    if not a.source.is_file():
        sys.exit(f"{a.source}: no such file")
    if a.out.exists():
        sys.exit(f"{a.out} exists: results are never overwritten (pick another name or remove it)")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    (plot_toy if a.kind == "toy" else plot_real)(a.source, a.out, a.title)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
