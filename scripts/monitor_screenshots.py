"""Screenshots of `lego monitor`'s terminal views for docs/monitoring.md: one SVG per view, the screen the live
monitor draws at 120×34, recorded by rich (``Console(record=True).export_svg``) from the same ``Monitor.render``
the live view calls, so no terminal or tmux is needed and the files are text (a few tens of kB each).

    .venv/bin/python scripts/monitor_screenshots.py [--out docs/images]

Runs: the recorded toy training run and rollout-check run the monitor's tests use (real `lego train` /
`lego rollout-check` runs), and the synthetic coding-agent run (tests/support/synthetic_run.py, a TEST DOUBLE:
four harnesses, infrastructure failures, policy lag) for the views a toy run leaves nearly empty.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from pathlib import Path

from rich.console import Console

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "tests"))
from support.synthetic_run import write_synthetic_run  # noqa: E402

from lego_rl.monitor import views  # noqa: E402
from lego_rl.monitor.app import Monitor  # noqa: E402

RUNS = HERE / "tests" / "monitor" / "runs"
WIDTH, HEIGHT = 120, 34
SHOTS = {
    "toy": ("overview", "curves", "tasks", "consistency", "behaviour"),
    "check": ("rollouts",),
    "synthetic": ("terminations", "timing", "pipeline", "compare"),
}
"""Which run each view is shown on (``compare``: the synthetic run against another seed of it)."""


def shoot(root: Path, view: str, out: Path, other: Path | None = None) -> Path:
    mon = Monitor(root, kl_warn=1e-3, other=other if view == "compare" else None)
    mon.view = view
    mon.refresh()
    console = Console(record=True, width=WIDTH, height=HEIGHT, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor")
    console.print(mon.render(WIDTH, HEIGHT))
    path = out / f"monitor-{view}.svg"
    title = dict((s, t) for _, s, t in views.VIEWS)[view]
    path.write_text(console.export_svg(title=f"lego monitor — {title}"), encoding="utf-8")
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE / "docs" / "images")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        # Run from a scratch folder holding the runs under short names: the header shows the path it was given.
        os.chdir(tmp)
        write_synthetic_run(Path("synthetic"), steps=40, groups=4, group_size=4, tasks=12, artifacts=4)
        write_synthetic_run(Path("synthetic-seed1"), steps=40, groups=4, group_size=4, tasks=12, artifacts=4,
                            seed=1)
        Path("toy-train").symlink_to(RUNS / "toy-train")
        Path("rollout-check").symlink_to(RUNS / "rollout-check")
        roots = {"toy": Path("toy-train"), "check": Path("rollout-check"), "synthetic": Path("synthetic")}
        for run, shots in SHOTS.items():
            for view in shots:
                path = shoot(roots[run], view, out, other=Path("synthetic-seed1"))
                print(f"{path} ({path.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
