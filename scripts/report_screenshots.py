"""Screenshots of `lego report`'s views for docs/monitoring.md: one PNG per section, drawn by headless Chromium.

    .venv/bin/python scripts/report_screenshots.py [--out docs/images]

Runs: the recorded toy training run and rollout-check run the monitor's tests use (real `lego train` /
`lego rollout-check` runs), and the synthetic coding-agent run (tests/support/synthetic_run.py, a TEST DOUBLE:
four harnesses, infrastructure failures, policy lag) for the views a toy run leaves empty. Each section is cut
from a full-page screenshot at the place Chromium laid it out, at most ``MAX_H`` px tall, and stored as a
palette PNG (the charts use few colours) to stay small. Needs chromium-headless-shell and Pillow.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "tests"))
from support.synthetic_run import write_synthetic_run  # noqa: E402

from lego_rl.monitor.report import write_report  # noqa: E402

RUNS = HERE / "tests" / "monitor" / "runs"
WIDTH, MAX_H = 1150, 1000
SHOTS = {
    "toy": ("overview", "training", "tasks", "consistency"),
    "check": ("rollouts",),
    "synthetic": ("rewards", "terminations", "timing", "staleness", "pipeline"),
}
PROBE = """<script>
const r = [...document.querySelectorAll('section')].map(s => {const b = s.getBoundingClientRect();
  return [s.id, b.top + window.scrollY, b.height];});
document.body.setAttribute('data-rects', JSON.stringify([r, document.documentElement.scrollHeight]));
</script>"""


def _chromium(*args: str) -> str:
    exe = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if exe is None:
        raise SystemExit("no headless Chromium: apt-get install chromium-headless-shell")
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          check=True, capture_output=True, text=True, timeout=300).stdout


def _sections(page: Path) -> tuple[list[tuple[str, float, float]], int]:
    probe = page.with_name("probe-" + page.name)
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = _chromium(f"--window-size={WIDTH},900", "--dump-dom", probe.as_uri())
    found = re.search(r'data-rects="([^"]*)"', dom)
    assert found is not None
    rects, height = json.loads(html.unescape(found.group(1)))
    return [tuple(r) for r in rects], int(height)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "docs" / "images")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        synthetic = work / "synthetic-run"
        write_synthetic_run(synthetic, steps=30, groups=8, group_size=4, tasks=24, artifacts=10)
        runs = {"toy": RUNS / "toy-train", "check": RUNS / "rollout-check", "synthetic": synthetic}
        for name, wanted in SHOTS.items():
            page = write_report(runs[name], work / f"{name}.html", kl_warn=1e-3)
            rects, height = _sections(page)
            png = work / f"{name}.png"
            _chromium(f"--window-size={WIDTH},{height}", f"--screenshot={png}", page.as_uri())
            full = Image.open(png).convert("RGB")
            for sid, top, h in rects:
                if sid not in wanted:
                    continue
                crop = full.crop((0, int(top), WIDTH, int(top + min(h, MAX_H))))
                dest = args.out / f"report-{sid}.png"
                crop.quantize(colors=64).save(dest, optimize=True)
                print(f"{dest}: {dest.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
