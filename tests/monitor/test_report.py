"""`lego report RUN_DIR --html OUT`: one self-contained file, checked twice: its structure (every section, the
SVG plots, nothing fetched from anywhere, run text escaped) and what headless Chromium actually draws (a
screenshot whose pixels hold the plots' colours; a control page without the plots holds none)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from monitor_runs import CHECK, TOY
from typer.testing import CliRunner

from lego_rl.cli.main import app

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
runner = CliRunner()
SECTIONS = ("overview", "training", "rewards", "terminations", "timing", "tasks", "consistency", "staleness",
            "pipeline", "behaviour", "rollouts", "metrics")


def _report(run: Path, out: Path, *extra: str) -> str:
    res = runner.invoke(app, ["report", str(run), "--html", str(out), *extra])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output
    return out.read_text(encoding="utf-8")


def test_the_report_holds_every_view_and_fetches_nothing(tmp_path: Path) -> None:
    html = _report(TOY, tmp_path / "toy.html")
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in html
    assert html.count("<svg") >= 7  # curves, termination stacks, stage timing, grid, KL, Pearson, pipeline
    # offline: the only URL is the SVG namespace; no script, no external stylesheet, font or image
    assert set(re.findall(r"https?://[^\"' )]+", html)) == {"http://www.w3.org/2000/svg"}
    assert "<script" not in html and "<link" not in html and "@import" not in html and "<img" not in html
    # the task grid draws one cell per finished rollout
    events = (TOY / "events.jsonl").read_text()
    grid = re.search(r'<svg[^>]*aria-label="task grid".*?</svg>', html, flags=re.DOTALL)
    assert grid is not None
    assert grid.group(0).count("<rect ") == events.count('"kind":"rollout_finished"')


def test_run_text_is_escaped_and_an_existing_report_is_replaced_only_with_force(
    tmp_path: Path, copy_run: Callable[[Path], Path]
) -> None:
    run = copy_run(CHECK)
    events = run / "events.jsonl"
    events.write_text(events.read_text().replace("lego-example-median", "<b>evil</b>&task"))
    out = tmp_path / "r.html"
    html = _report(run, out)
    assert "<b>evil</b>" not in html and "&lt;b&gt;evil&lt;/b&gt;&amp;task" in html
    out.write_text("an older report", encoding="utf-8")
    res = runner.invoke(app, ["report", str(run), "--html", str(out)])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and f"{out} already exists: give --force to replace it" in said
    assert out.read_text(encoding="utf-8") == "an older report"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".r.html")]  # no temp file left behind
    replaced = _report(run, out, "--force")
    assert replaced.startswith("<!DOCTYPE html>") and "&lt;b&gt;evil&lt;/b&gt;&amp;task" in replaced


def test_a_directory_holding_no_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", str(tmp_path / "empty"), "--html", str(out)])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and f"{tmp_path / 'empty'} holds no run" in said
    assert not out.exists()


def test_compare_section(tmp_path: Path, copy_run: Callable[[Path], Path]) -> None:
    html = _report(TOY, tmp_path / "c.html", "--compare", str(copy_run(TOY)))
    assert '<section id="compare">' in html and "24 tasks in both: 0 up, 0 down" in html
    for title in ("reward mean per step", "solve rate per step", "loss per step", "entropy per step"):
        assert f'aria-label="{title}"' in html


def _pixels(png: bytes) -> Counter[tuple[int, int, int]]:
    """Colour counts of a PNG, decoded by Pillow (a pure-Python decoder took ~15 s per 1200x2600 page)."""
    from PIL import Image

    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(png)) as image:
        rgb = image.convert("RGB")
        colours = rgb.getcolors(maxcolors=rgb.width * rgb.height)
    assert colours is not None
    return Counter({colour: n for n, colour in colours})


def _screenshot(html: Path, png: Path) -> Counter[tuple[int, int, int]]:
    assert CHROMIUM is not None
    # every request but the file itself would go to a dead proxy: a page that needs the network shows it
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--proxy-server=http://127.0.0.1:9",
            "--window-size=1200,2600",
            f"--screenshot={png}",
            html.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return _pixels(png.read_bytes())


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium: apt-get install chromium-headless-shell")
def test_headless_chromium_screenshot_shows_the_plots(tmp_path: Path) -> None:
    html = tmp_path / "toy.html"
    text = _report(TOY, html)
    shot = _screenshot(html, tmp_path / "toy.png")
    blue, orange, green, red = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C), (0xD6, 0x27, 0x28)
    assert shot[blue] > 20_000  # termination bars (and the reward curve)
    assert shot[orange] > 500  # the solve-rate curve
    assert shot[red] > 5_000 and shot[green] > 200  # the task grid's failed and solved cells
    # control: the same page without its SVG plots has none of those colours in quantity
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<svg.*?</svg>", "", text, flags=re.DOTALL), encoding="utf-8")
    control = _screenshot(bare, tmp_path / "bare.png")
    assert control[blue] < 50 and control[red] < 50 and control[orange] < 50
