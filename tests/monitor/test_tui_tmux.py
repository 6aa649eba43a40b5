"""The real `lego monitor` TUI in a real terminal: tmux runs it, keys go in with send-keys, the screen comes back
with capture-pane. Against the recorded runs, and against a run that grows while it is watched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from monitor_runs import CHECK, TOY
from stage_runs import write_main_job

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux missing: `make system-deps` installs it"
)

LEGO = str(Path(sys.executable).with_name("lego"))


class Screen:
    """One tmux server of our own (its own socket) running one command in a 160×50 window."""

    def __init__(self, command: list[str], cwd: Path) -> None:
        self.socket = f"lego-monitor-test-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        env["TERM"] = "xterm-256color"
        self._tmux(
            "new-session",
            "-d",
            "-s",
            "mon",
            "-x",
            "160",
            "-y",
            "50",
            "-c",
            str(cwd),
            " ".join(subprocess.list2cmdline([c]) for c in command) + "; sleep 30",
            env=env,
        )

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        ).stdout

    def text(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "mon")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "mon", *keys)

    def wait(self, *what: str, timeout: float = 180.0) -> str:
        """The screen once it shows every one of ``what`` at the same time (a capture can fall between two
        halves of a redraw, so a test waits for everything it then reads, never asserts on a first sight)."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.text()
            if all(w in screen for w in what):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{what!r} not all on screen after {timeout}s; the screen:\n{screen}")
            time.sleep(0.2)

    def close(self) -> None:
        subprocess.run(
            ["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30, check=False
        )


@pytest.fixture
def screen(tmp_path: Path) -> Iterator[type[Screen]]:
    made: list[Screen] = []

    class Tracked(Screen):
        def __init__(self, command: list[str], cwd: Path = tmp_path) -> None:
            super().__init__(command, cwd)
            made.append(self)

    yield Tracked
    for s in made:
        s.close()


def test_every_view_by_key_then_drill_down_search_and_quit(screen: type[Screen]) -> None:
    s = screen([LEGO, "monitor", str(TOY)])
    s.wait("weight version 14", "steps done 16/16 (last: step 15)", "2/l Curves", "finished (completed)",
           "1/o Overview")
    for key, title in [
        ("t", "termination mix per step"),
        ("s", "stage seconds per harness"),
        ("g", "24 tasks; zero-variance groups"),
        ("c", "rollout vs trainer log-probs"),
        ("b", "behaviour per harness"),
        ("p", "where each step's time went"),
        ("3", "termination mix per step"),
        ("l", "rollouts: reward, spread within groups"),
        ("9", "where each step's time went"),
        ("o", "eval pass@1"),
    ]:
        s.keys(key)
        s.wait(title)
    s.keys("r")
    s.wait("latest finished rollouts")
    s.keys("Down", "Enter")
    s.wait("timeline", "eval00015-g3-fl-3-2", "finished: completed")  # the second newest rollout
    s.keys("Escape")
    s.wait("latest finished rollouts")
    s.keys("/")
    s.wait("search (task: harness:")
    s.keys("task:fl-16 step:3", "Enter")
    found = s.wait("rollouts matching 'task:fl-16 step:3' (8;", "s00003-g3-fl-16-")
    for _ in range(50):  # the list may still be drawing: read it whole
        if found.count("s00003-g3-fl-16-") == 8:
            break
        time.sleep(0.2)
        found = s.text()
    assert found.count("s00003-g3-fl-16-") == 8 and "eval" not in found.split("rollouts matching")[1]
    # from a termination reason and from a worst consistency step to their rollouts
    s.keys("t")
    s.wait("pick a reason")
    s.keys("Enter")
    s.wait("rollouts matching 'reason:completed'")
    s.keys("c")
    s.wait("pick a step")
    s.keys("Down", "Enter")
    worst = sorted(
        (
            json.loads(line)
            for line in (TOY / "metrics.jsonl").read_text().splitlines()
            if "consistency/k3_kl" in line
        ),
        key=lambda r: -r["values"]["consistency/k3_kl"],
    )
    # the worst step's rollouts, filtered (which of its 32 fit the window depends on the list's scroll position)
    s.wait(f"rollouts matching 'step:{worst[1]['step']}' (", f"s{worst[1]['step']:05d}-g")
    s.keys("q")
    deadline = time.monotonic() + 10
    while "weight version" in s.text() or "rollouts matching" in s.text():
        assert time.monotonic() < deadline, "q did not quit: " + s.text()
        time.sleep(0.2)


def test_rollout_check_drill_down_shows_patch_transcript_and_grader(screen: type[Screen]) -> None:
    s = screen([LEGO, "monitor", str(CHECK)])
    s.wait("baseline     lego-example-median: unsolved")
    s.keys("r")
    s.wait("lego-example-median-s0")
    s.keys("Enter")
    s.wait("timeline", "harness_install: ok", "turns (tool calls)")
    for _ in range(6):  # to the end (the view stops there): the grader's verdict, last line of its log
        s.keys("PageDown")
    s.wait("SOLVED (baseline; exit status 1 unused)")


def test_follows_a_run_as_it_is_written(screen: type[Screen], tmp_path: Path) -> None:
    run = tmp_path / "live"
    run.mkdir()
    (run / "config.json").write_bytes((TOY / "config.json").read_bytes())
    events = (TOY / "events.jsonl").read_bytes().splitlines(keepends=True)
    metrics = (TOY / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(events) if b'"step_finished"' in line and b'"step":4' in line) + 1
    (run / "events.jsonl").write_bytes(b"".join(events[:cut]))
    (run / "metrics.jsonl").write_bytes(b"".join(metrics[:5]))
    s = screen([LEGO, "monitor", str(run), "--set", "monitor.refresh_s=0.3"])
    s.wait("steps done 5/16 (last: step 4)", "running", "ETA")
    with (run / "events.jsonl").open("ab") as fh:
        fh.write(b"".join(events[cut:]))
    with (run / "metrics.jsonl").open("ab") as fh:
        fh.write(b"".join(metrics[5:]))
    s.wait("finished (completed)", "steps done 16/16")


def test_the_main_jobs_folder_lists_its_stages_opens_one_and_goes_back(
    screen: type[Screen], tmp_path: Path
) -> None:
    """The stages of a folder of runs (stage_runs.write_main_job), the SFT stage's curves, the GRPO stage's
    asynchronous rollout: started during step 0, trained in step 1."""
    parent = write_main_job(tmp_path / "main-3")
    s = screen([LEGO, "monitor", str(parent)])
    listed = s.wait("stages, in the order they started", "demos", "grpo")
    assert "holds no run (" not in listed
    s.keys("Down", "Enter")
    s.wait("steps done 3/3 (last: step 2)", "[sft]", "loss")
    s.keys("l")
    s.wait("nll")
    s.keys("Escape")
    s.wait("stages, in the order they started")
    s.keys("Down", "Enter")
    # the staleness regression: the policy lag the loop wrote, never "staleness 0 (synchronous ...)"
    grpo = s.wait("steps done 2/2 (last: step 1)",
                  "policy_lag_mean 1.00, policy_lag_max 1.00; asynchronous loop (rollout.max_staleness 1)")
    assert "staleness 0" not in grpo
    s.keys("r")
    s.wait("latest finished rollouts")
    s.keys("Enter")
    s.wait("during step 0", "in step 1's batch (sampled from policy 0)")


@pytest.mark.slow
def test_follows_a_real_lego_train_run_from_its_first_event_to_its_end(
    screen: type[Screen], tmp_path: Path
) -> None:
    """`lego train` (the toy environment, tiny model on CPU) writes while the TUI watches the directory."""
    from lego_rl.driver.toy_env import make_rows

    (tmp_path / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_rows(8)))
    (tmp_path / "lego.toml").write_text(
        '[serving]\ndevice = "cpu"\nport = 0\n[sandbox]\nprovider = "bwrap"\n[rollout]\nprompt_data = "toy.jsonl"\n'
        'batch_size = 2\nsamples_per_prompt = 4\ntop_p = 1.0\n[train]\nenvironment = "first_letter"\n'
        'num_rollout = 12\n[paths]\nrun_root = "runs/toy"\n'
    )
    run = tmp_path / "runs" / "toy"
    run.mkdir(parents=True)
    s = screen([LEGO, "monitor", str(run), "--set", "monitor.refresh_s=0.5"])
    s.wait("holds no run")  # nothing there yet: said so, and the monitor keeps watching
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEGO_", "RUN_", "HF_", "DATA_ROOT"))}
    train = subprocess.Popen(
        [LEGO, "train", "-c", "lego.toml", "--json"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        s.wait("[train] running", timeout=300)
        s.wait("finished (completed)", "steps done 12/12", timeout=600)
    finally:
        try:
            _, err = train.communicate(timeout=120)  # training_finished is written just before it exits
        except subprocess.TimeoutExpired:
            train.kill()
            _, err = train.communicate(timeout=60)
    assert train.returncode == 0, err[-2000:]
