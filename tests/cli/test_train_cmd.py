"""`lego train`: refusals before anything starts (exit 2), a real run on the toy environment through the
embedded engine, a dead engine (exit 3), SIGTERM mid-run (exit 130, resumable) and the resume.

Everything is the product's: the torch backend from ``train_session.BACKENDS``, the embedded engine, the
environment, the loop and the run store.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego_rl.cli.main import app
from lego_rl.monitor.state import RunState
from lego_rl.compose import train_session
from lego_rl.runstore import read_events
from lego_rl.driver.toy_env import score
from lego_rl.runstore import RunLayout
from lego_rl.runstore.env_rollouts import env_rollouts
from lego_rl.runstore.events import RolloutFinished, StepsAbandoned
from lego_rl.runstore.log import follow_metrics
from support.toy_run import scrub_config_env, write_toy_run

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    scrub_config_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    yield write_toy_run(tmp_path)


runner = CliRunner()


def said(res: object) -> str:
    """The output with rich's line wrapping undone."""
    return " ".join(res.output.split())  # type: ignore[attr-defined]


def test_failing_check_starts_nothing_and_names_the_key(toy: Path) -> None:
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--set", "train.global_batch_size=3"])
    assert res.exit_code == 2, res.output
    assert "train.global_batch_size=3 does not divide the 8 samples" in said(res)
    assert "nothing was started" in said(res)
    assert not (toy / "runs" / "toy").exists()


def test_loop_settings_are_refused_before_anything_starts(toy: Path) -> None:
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--set", "train.eval_every=2"])
    assert res.exit_code == 2 and "no held-out rows (train.eval_data)" in said(res)
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--set", "rollout.samples_per_prompt=1",
                              "--set", "rollout.batch_size=8"])
    assert res.exit_code == 2 and "samples_per_prompt must be at least 2" in said(res)
    assert not (toy / "runs" / "toy").exists()


def test_environment_training_needs_no_harness_plugin(toy: Path) -> None:
    """An environment runs no CLI: a default harness whose plugin is not installed is no reason to refuse it
    (it was: harness_missing, exit 2), while coding-agent training on the same config is still refused."""
    nosuch = "agent.default_harness=\"nosuch\""
    res = runner.invoke(app, ["validate", "-c", "lego.toml", "--json", "--set", nosuch])
    assert res.exit_code == 0 and json.loads(res.stdout)["findings"] == [], res.output
    tasks = REPO / "examples" / "tasks"
    res = runner.invoke(app, ["validate", "-c", "lego.toml", "--json", "--set", nosuch,
                              "--set", "train.environment=\"\"", "--set", f"rollout.prompt_data=\"{tasks / 'tasks.jsonl'}\"",
                              "--set", f"sandbox.images=\"{tasks / 'images.json'}\""])
    found = json.loads(res.stdout)["findings"]
    assert res.exit_code != 0 and [f["code"] for f in found] == ["harness_missing"], found
    assert "harness 'nosuch' (the default harness) is not installed" in found[0]["message"]


def test_validate_does_not_refuse_an_environment_run_for_a_sandbox_it_never_opens(toy: Path) -> None:
    """The issue's case: an environment-only config naming sunabako (without its memory mode) failed `lego
    validate` on sunabako_memory although an environment run opens no sandbox; coding-agent training on the
    same settings is still refused."""
    sunabako = "sandbox.provider=\"sunabako\""
    res = runner.invoke(app, ["validate", "-c", "lego.toml", "--json", "--set", sunabako])
    assert res.exit_code == 0 and json.loads(res.stdout)["findings"] == [], res.output
    tasks = REPO / "examples" / "tasks"
    agent = ["--set", "train.environment=\"\"", "--set", f"rollout.prompt_data=\"{tasks / 'tasks.jsonl'}\""]
    res = runner.invoke(app, ["validate", "-c", "lego.toml", "--json", "--set", sunabako, *agent])
    assert res.exit_code == 1 and "sunabako_memory" in {f["code"] for f in json.loads(res.stdout)["findings"]}


def test_missing_data_is_refused(toy: Path) -> None:
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--data", "nowhere.jsonl"])
    assert res.exit_code == 2 and "nowhere.jsonl, which does not exist" in said(res)


def test_bad_environment_row_names_file_and_line(toy: Path) -> None:
    with (toy / "toy.jsonl").open("a") as fh:
        fh.write(json.dumps({"id": "bad", "letter": "ab"}) + "\n")
    res = runner.invoke(app, ["train", "-c", "lego.toml"])
    assert res.exit_code == 2, res.output
    assert "toy.jsonl" in said(res) and "row 9" in said(res) and "letter must be one ASCII letter" in said(res)
    assert not (toy / "runs" / "toy").exists()  # refused before the run directory was made


def test_unknown_environment_lists_the_installed_ones(toy: Path) -> None:
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--env", "nosuch"])
    assert res.exit_code == 2 and "no environment 'nosuch'" in said(res) and "first_letter" in said(res)


def test_missing_trainer_backend_is_a_usage_error(toy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(train_session.BACKENDS, "torch")
    res = runner.invoke(app, ["train", "-c", "lego.toml"])
    assert res.exit_code == 2 and "train.backend = 'torch' has no trainer" in said(res)


def test_dead_engine_exits_3_with_a_clear_message(toy: Path) -> None:
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--vllm-url", "http://127.0.0.1:9"])
    assert res.exit_code == 3, res.output
    assert "not healthy: http://127.0.0.1:9" in said(res)
    # The run directory says how the run ended, although the loop never started.
    events = [json.loads(line) for line in (toy / "runs" / "toy" / "events.jsonl").read_text().splitlines()]
    assert events[-1]["kind"] == "training_finished" and events[-1]["status"] == "failed"
    assert events[-1]["steps_done"] == 0 and "http://127.0.0.1:9" in events[-1]["detail"]


def test_dead_engine_under_json_still_prints_one_object(toy: Path) -> None:
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--vllm-url", "http://127.0.0.1:9", "--json"])
    assert res.exit_code == 3
    obj = json.loads(res.stdout)
    assert obj["status"] == "failed" and obj["exit_code"] == 3 and "127.0.0.1:9" in obj["error"]


@pytest.mark.slow
def test_trains_the_toy_environment_and_writes_the_run_directory(toy: Path) -> None:
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["status"] == "completed" and summary["steps_done"] == 2
    root = toy / "runs" / "toy"
    rows = list(follow_metrics(root / "metrics.jsonl").read())
    assert [r.step for r in rows] == [0, 1]
    assert all("reward_mean" in r.values and "time_rollout_s" in r.values for r in rows)
    assert (root / "checkpoints" / "latest").read_text().strip() == "step-000001"
    events = read_events(root / "events.jsonl")
    kinds = [e.kind for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "training_finished"
    assert kinds.count("rollout_finished") >= 16 and "serving_ready" in kinds
    assert json.loads((root / "config.json").read_text())
    # Every rollout's answer and the environment's metadata are in the run directory, as the reward was read.
    finished = {e.rollout_id: e for e in events if isinstance(e, RolloutFinished)}
    kept = {r.rollout_id: r for r in env_rollouts(RunLayout(root))}
    assert set(kept) == set(finished)
    for rid, rec in kept.items():
        [c] = rec.completions
        assert rec.reward == finished[rid].reward == score("a", c.text) and rec.metadata == {"answer": c.text}
        assert 1 <= c.output_tokens <= 4 and c.finish_reason in ("stop", "length")


@pytest.mark.slow
def test_two_runs_on_one_host_each_get_a_free_engine_port_and_record_it(toy: Path) -> None:
    """Two ``lego train`` at once in two run directories, serving.port left at its default: each engine
    listens on a port of its own (they collided on a fixed 18100 with a traceback), and each run's
    serving_ready event names the URL it got."""
    lego = str(Path(sys.executable).with_name("lego"))
    first = subprocess.Popen([lego, "train", "-c", "lego.toml", "--steps", "3", "--run-root", "runs/a"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=toy)
    events = toy / "runs" / "a" / "events.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (events.exists() and "serving_ready" in events.read_text()):
        assert first.poll() is None, first.communicate()
        time.sleep(0.1)
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--steps", "1", "--run-root", "runs/b", "--json"])
    _, stderr = first.communicate(timeout=300)
    assert res.exit_code == 0 and first.returncode == 0, (res.output, stderr)
    urls = [[e.serving for e in read_events(toy / "runs" / name / "events.jsonl")
             if e.kind == "serving_ready"] for name in ("a", "b")]
    assert [len(u) for u in urls] == [1, 1] and urls[0] != urls[1], urls
    assert all(u[0][0].startswith("http://127.0.0.1:") and not u[0][0].endswith(":0") for u in urls), urls


def test_a_taken_engine_port_is_one_line_and_exit_2(toy: Path) -> None:
    """An explicit serving.port another process listens on: one line naming the address and the key, no
    traceback, exit 2, before the model loads."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = runner.invoke(app, ["train", "-c", "lego.toml", "--set", f"serving.port={port}"])
    assert res.exit_code == 2, res.output
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in said(res), res.output
    assert "serving.port" in said(res) and "Traceback" not in res.output


@pytest.mark.slow
def test_progress_to_a_file_is_whole_lines_one_per_phase(toy: Path) -> None:
    """stderr that is no terminal (a log file, as under nohup or make run): one newline-ended line per step and
    phase, heartbeats with the counts of the moment, one summary per step that says what its metrics row says,
    no cursor-control codes or carriage returns, the last status line the run's end without an ETA and with the
    last step's own rollout count; the summary on its own line."""
    lego = str(Path(sys.executable).with_name("lego"))
    log = toy / "train.log"
    with log.open("w") as fh:
        proc = subprocess.run([lego, "train", "-c", "lego.toml", "--steps", "2", "--set", "log.heartbeat_s=0.5"],
                              stdout=subprocess.PIPE, stderr=fh, text=True, cwd=toy, timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text
    assert text.endswith("\n") and "\x1b" not in text and "\r" not in text
    progress = [line for line in text.splitlines() if line.startswith("step ") and " done " not in line]
    phases = [line.split()[1:3] for line in progress]
    # Phases shorter than the 0.5 s poll may not show up (a quiet box rolls the toy env out in less).
    assert phases[0][0] == "1/2" and phases[0][1] in ("rollout", "train", "sync"), progress
    steps = [int(p[0].split("/")[0]) for p in phases]
    assert steps == sorted(steps), progress
    assert len(phases) == len({tuple(p) for p in phases})  # each (step, phase) once: not a line per poll
    assert phases[-1] == ["2/2", "completed"] and progress[-1].endswith("ETA -"), progress
    assert proc.stdout.startswith("completed: 2/2 steps"), proc.stdout
    # The heartbeat repeats the status with live counts while a phase lasts (the toy's engine start alone
    # takes longer than 0.5 s, so there is at least one).
    assert [line for line in text.splitlines() if line.startswith("heartbeat ")], text
    rows = list(follow_metrics(toy / "runs" / "toy" / "metrics.jsonl").read())
    done = [line for line in text.splitlines() if " done " in line]
    assert [d.split()[1] for d in done] == ["1/2", "2/2"], text
    for line, row in zip(done, rows, strict=True):
        n = int(row.values["rollouts"])
        assert f"rollouts {n} (admitted {int(row.values['admitted_rollouts'])}" in line
        assert f"reward {row.values['reward_mean']:.3f}" in line and f"time {row.values['time_step_s']:.1f}s" in line
    # Counts are the step's own: the last line says every rollout of the last step, not those since a phase began.
    assert f"rollouts {int(rows[-1].values['rollouts'])}/{int(rows[-1].values['rollouts'])}" in progress[-1]


@pytest.mark.slow
def test_torchrun_master_port_0_is_refused_instead_of_hanging(toy: Path) -> None:
    """``torchrun --master-port 0`` tells every rank MASTER_PORT=0 while its store listens elsewhere: the ranks
    waited for each other until the rendezvous timeout. Each rank now refuses before joining (exit 2)."""
    lego = str(Path(sys.executable).with_name("lego"))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
                           "--master-port=0", lego, "train", "-c", "lego.toml"], cwd=toy, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0, proc.stderr[-3000:]
    text = " ".join(proc.stderr.split())
    assert "MASTER_PORT='0' (torchrun --master-port)" in text and "torchrun --master-port 29500" in text, text[-3000:]
    assert time.monotonic() - started < 240  # refused, not timed out
    assert not (toy / "runs" / "toy").exists()  # nothing was started


@pytest.mark.slow
def test_sigterm_stops_with_a_resumable_state_and_resume_continues(toy: Path) -> None:
    lego = str(Path(sys.executable).with_name("lego"))
    proc = subprocess.Popen([lego, "train", "-c", "lego.toml", "--steps", "50", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=toy)
    metrics = toy / "runs" / "toy" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "SIGTERM: stopping" in stderr
    assert json.loads(stdout)["status"] == "stopped"
    root = toy / "runs" / "toy"
    done = [r.step for r in follow_metrics(metrics).read()]
    latest = (root / "checkpoints" / "latest").read_text().strip()
    assert latest == f"step-{done[-1]:06d}"  # the last completed step, not the abandoned one
    events = read_events(root / "events.jsonl")
    assert events[-1].kind == "training_finished" and events[-1].status == "stopped"
    # Both sides stopped: every rollout started either finished or was cancelled (none left running).
    started = {e.rollout_id for e in events if e.kind == "rollout_started"}
    ended = {e.rollout_id for e in events if e.kind in ("rollout_finished", "rollout_cancelled")}
    assert started <= ended, started - ended

    res = runner.invoke(app, ["train", "-c", "lego.toml", "--resume", "--steps", str(done[-1] + 2), "--json"])
    assert res.exit_code == 0, res.output
    steps = [r.step for r in follow_metrics(metrics).read()]
    assert steps == [*done, done[-1] + 1]  # continues after the last completed step, no step twice
    assert (root / "config.resume-1.json").exists()


@pytest.mark.slow
def test_roll_back_then_resume_sets_the_abandoned_steps_aside(toy: Path) -> None:
    """A roll back as docs/training.md tells it (newer checkpoints moved out, ``latest`` pointed back, --resume):
    the steps after the checkpoint are retrained, and the rows the first run wrote for them are moved whole to
    metrics.abandoned-1.jsonl, never mixed with the new ones; a steps_abandoned event marks their events, and
    the monitor shows the resumed run's steps only."""
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--steps", "3", "--set", "train.checkpoint_every=1",
                              "--json"])
    assert res.exit_code == 0, res.output
    root = toy / "runs" / "toy"
    checkpoints = root / "checkpoints"
    before = (root / "metrics.jsonl").read_bytes()
    first = {r.step: r for r in follow_metrics(root / "metrics.jsonl").read()}
    assert sorted(first) == [0, 1, 2]
    (toy / "kept").mkdir()
    for name in ("step-000001", "step-000002"):
        (checkpoints / name).rename(toy / "kept" / name)
    (checkpoints / "latest").write_text("step-000000\n")

    res = runner.invoke(app, ["train", "-c", "lego.toml", "--resume", "--steps", "2", "--json"])
    assert res.exit_code == 0, res.output
    rows = list(follow_metrics(root / "metrics.jsonl").read())
    assert [r.step for r in rows] == [0, 1]
    assert rows[0] == first[0] and rows[1].started_at > first[2].finished_at  # step 1 is the retrained one
    assert (root / "metrics.abandoned-1.jsonl").read_bytes() == before  # every old row kept, byte for byte
    marks = [e for e in read_events(root / "events.jsonl") if isinstance(e, StepsAbandoned)]
    assert [(m.resumed_from, m.steps, m.metrics_set_aside) for m in marks] == [(0, [1, 2], "metrics.abandoned-1.jsonl")]
    state = RunState(root)
    state.refresh()
    assert sorted(state.steps) == [0, 1] and state.steps[1].metrics == rows[1]
    assert [c.step for c in state.checkpoints] == [0, 1]
    assert any("steps 1, 2 recorded before were abandoned" in n.text for n in state.notes())


@pytest.mark.slow
def test_kill_9_before_any_checkpoint_then_resume_sets_the_orphaned_steps_aside(toy: Path) -> None:
    """kill -9 with the default train.checkpoint_every = 0 leaves steps in metrics.jsonl and no checkpoint.
    The resume starts again from the initial weights: the rows of the killed run move whole to
    metrics.abandoned-1.jsonl and a steps_abandoned event (resumed_from None) marks them, so no step is in
    metrics.jsonl twice; the dead holder of the lock is named at the step the resume continues with."""
    lego = str(Path(sys.executable).with_name("lego"))
    proc = subprocess.Popen([lego, "train", "-c", "lego.toml", "--steps", "50", "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=toy)
    root = toy / "runs" / "toy"
    metrics = root / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not (root / "checkpoints" / "latest").exists()
    before = metrics.read_bytes()
    killed = [r.step for r in follow_metrics(metrics).read()]
    assert killed[:1] == [0], killed
    # The next step was in flight: begun, never finished.
    begun = {e.step for e in read_events(root / "events.jsonl") if e.kind == "step_started"}

    res = runner.invoke(app, ["train", "-c", "lego.toml", "--resume", "--steps", "2", "--json"])
    assert res.exit_code == 0, res.output
    rows = list(follow_metrics(metrics).read())
    assert [r.step for r in rows] == [0, 1]  # each step once: the killed run's rows are not mixed in
    assert (root / "metrics.abandoned-1.jsonl").read_bytes() == before
    events = read_events(root / "events.jsonl")
    marks = [(e.step, e.resumed_from, e.steps, e.metrics_set_aside)
             for e in events if isinstance(e, StepsAbandoned)]
    assert marks == [(0, None, sorted(begun), "metrics.abandoned-1.jsonl")] and set(killed) <= begun
    stale = [(e.previous_pid, e.step) for e in events if e.kind == "stale_lock_taken"]
    assert stale == [(proc.pid, 0)]
    state = RunState(root)
    state.refresh()
    assert sorted(state.steps) == [0, 1] and state.steps[1].metrics == rows[1]
    assert any("resumed without a checkpoint (from the initial weights)" in n.text for n in state.notes())


def test_resume_with_checkpoints_but_no_latest_pointer_is_refused_naming_them(toy: Path) -> None:
    """A process that died between writing a checkpoint and publishing ``latest``: a resume would start from
    the initial weights and later fail saving over that checkpoint, so it is refused up front."""
    root = toy / "runs" / "toy"
    (root / "checkpoints" / "step-000000").mkdir(parents=True)
    (root / "events.jsonl").write_text('{"kind":"run_started","ts":1.0,"root":"runs/toy"}\n')
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--resume"])
    assert res.exit_code == 2, res.output
    assert "holds step-000000 but no `latest` pointer" in said(res) and "Traceback" not in res.output
    assert (root / "events.jsonl").read_text().count("\n") == 1  # nothing was started


def test_resume_behind_newer_checkpoints_is_refused_before_anything_starts(toy: Path) -> None:
    """A roll back done by pointing ``latest`` at an older checkpoint: the resume would retrain the newer steps and
    fail mid-run saving over their (never overwritten) checkpoints, so it is refused up front, naming them."""
    root = toy / "runs" / "toy"
    checkpoints = root / "checkpoints"
    for name in ("step-000000", "step-000001", "step-000002"):
        (checkpoints / name).mkdir(parents=True)
    (root / "events.jsonl").write_text('{"kind":"run_started","ts":1.0,"root":"runs/toy"}\n')
    (checkpoints / "latest").write_text("step-000000\n")
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--resume"])
    assert res.exit_code == 2, res.output
    assert "step-000001, step-000002 (newer)" in said(res) and "move them out of checkpoints/" in said(res)
    assert (root / "events.jsonl").read_text().count("\n") == 1  # nothing was started
    # Pointing at the newest is an ordinary resume: it gets past this refusal to the next one (a bad data row,
    # which the session finds after it).
    (checkpoints / "latest").write_text("step-000002\n")
    with (toy / "toy.jsonl").open("a") as fh:
        fh.write(json.dumps({"id": "bad", "letter": "ab"}) + "\n")
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--resume"])
    assert res.exit_code == 2 and "(newer)" not in said(res) and "letter must be one ASCII letter" in said(res)


def test_resume_while_another_process_trains_the_run_is_refused_naming_it(toy: Path) -> None:
    """Two ``lego train --resume`` on one run directory: the second exits 4 with one line naming the holder
    (pid, host, since when) and starts nothing."""
    root = toy / "runs" / "toy"
    root.mkdir(parents=True)
    (root / "events.jsonl").write_text('{"kind":"run_started","ts":1.0,"root":"runs/toy"}\n')
    hold = ("import sys, time\nfrom lego_rl.runstore.lock import RunLock\nRunLock.acquire(__import__('pathlib')"
            ".Path(sys.argv[1]))\nprint('locked', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", hold, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        res = runner.invoke(app, ["train", "-c", "lego.toml", "--resume"])
        assert res.exit_code == 4, res.output
        assert f"is in use by pid {proc.pid} on " in said(res) and "Traceback" not in res.output
        assert not (root / "config.resume-1.json").exists()
    finally:
        proc.kill()
        proc.wait()


def test_resume_with_a_changed_lr_is_refused_naming_both_values(toy: Path) -> None:
    """``--resume --set train.lr=...`` on a run trained at another lr: exit 2 naming the key, both values and
    ``--override``; nothing is started (no new config file)."""
    from lego_rl.cli.options import load
    from lego_rl.config.resolve import config_json

    root = toy / "runs" / "toy"
    root.mkdir(parents=True)
    first = load(Path("lego.toml"), ["train.lr=3e-4"], {})
    (root / "config.json").write_text(json.dumps(config_json(first), default=str))
    (root / "events.jsonl").write_text('{"kind":"run_started","ts":1.0,"root":"runs/toy"}\n')
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--resume", "--set", "train.lr=3e-3"])
    assert res.exit_code == 2, res.output
    assert "train.lr = 0.003" in said(res) and "trained with 0.0003" in said(res)
    assert "--override train.lr" in said(res) and not (root / "config.resume-1.json").exists()


@pytest.mark.slow
def test_resume_with_override_trains_at_the_new_lr_records_and_marks_it(toy: Path) -> None:
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--steps", "2", "--set", "train.lr=3e-4", "--json"])
    assert res.exit_code == 0, res.output
    root = toy / "runs" / "toy"
    res = runner.invoke(app, ["train", "-c", "lego.toml", "--resume", "--steps", "5", "--set", "train.lr=3e-3",
                              "--override", "train.lr", "--json"])
    assert res.exit_code == 0, res.output
    rows = list(follow_metrics(root / "metrics.jsonl").read())
    lrs = [(r.step, r.values.get("lr")) for r in rows]  # a step whose groups all tied trains nothing: no lr
    assert [s for s, _ in lrs] == [0, 1, 2, 3, 4], lrs
    assert all(lr in (None, 3e-4) for s, lr in lrs[:2]) and all(lr in (None, 3e-3) for s, lr in lrs[2:]), lrs
    assert any(lr is not None for _, lr in lrs[2:]), lrs
    recorded = json.loads((root / "config.resume-1.json").read_text())
    assert recorded["train"]["lr"]["value"] == 3e-3 and recorded["train"]["resume_override"]["value"] == ["train.lr"]
    marks = [e for e in read_events(root / "events.jsonl") if e.kind == "resume_override"]
    assert [(m.step, m.key, m.before, m.after) for m in marks] == [(2, "train.lr", 3e-4, 3e-3)]
