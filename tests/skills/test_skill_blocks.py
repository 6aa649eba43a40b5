"""Every skills/*/SKILL.md: Agent Skills format (front matter with name and description, then steps), and every
command block runs, as written, so a skill cannot rot.

Blocks of one skill run in order, in one fresh working directory (a later step uses what an earlier one made:
a run, a checkpoint, a file), each with bash errexit and pipefail and the venv's ``lego`` first on PATH. What a
block may name, all copies in tmp (a block never writes into the repository):

* ``$REPO``: the checkout (``$REPO/lego.toml``, the example tasks ``$TASKS`` = ``$REPO/examples/tasks``);
* ``$RUN``: a real ``lego train`` run (tests/monitor/runs/toy-train), ``$OTHER`` a second copy of it;
* ``$CHECK_RUN``: a real ``lego rollout-check`` run of Claude Code (tests/monitor/runs/rollout-check);
* ``$WORK``: the working directory.

``SWE_AGENT_TIME_BUDGET_SEC=10`` is set so that a block running a real coding CLI with the random tiny model
ends in seconds (the budget is what ends such a rollout anyway). A block that cannot run in CI starts with the
marker line ``# skill-test: skip — <reason>`` and is not run; an unmarked block that fails fails the test.
Skills whose blocks train or roll out for real are marked slow (they still run in ``make test``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKILLS = REPO / "skills"
RUNS = REPO / "tests" / "monitor" / "runs"
SKILL_FILES = sorted(SKILLS.glob("*/SKILL.md"))

FRONT = re.compile(r"---\nname: (?P<name>[a-z0-9-]+)\ndescription: (?P<description>[^\n]+)\n---\n")
BLOCK = re.compile(r"^ *```bash\n(.*?)^ *```", flags=re.DOTALL | re.MULTILINE)  # indented inside a step
SKIP = re.compile(r"^# skill-test: skip\b(?P<rest>.*)$", flags=re.MULTILINE)
SKIP_REASON = re.compile(r" — (\S.{9,})$")  # the reason: an em dash, then at least ten characters

# Skills whose blocks train the toy environment or run a real CLI (tens of seconds each on a 2-core machine).
SLOW = {"launch-training", "resume", "rollout-check", "check-tasks"}


@dataclass(frozen=True)
class Block:
    skill: str
    index: int
    text: str

    @property
    def skip_reason(self) -> str | None:
        """The marked reason this block is not run in CI (None: it runs); a bare marker is an error."""
        m = SKIP.search(self.text)
        if m is None:
            return None
        reason = SKIP_REASON.match(m.group("rest"))
        if reason is None:
            raise ValueError(f"skills/{self.skill}/SKILL.md block {self.index}: the skip marker must say why, as "
                             f"'# skill-test: skip — <reason>', got {m.group(0)!r}")
        return reason.group(1)


def blocks_of(path: Path) -> list[Block]:
    return [Block(path.parent.name, i, textwrap.dedent(text))
            for i, text in enumerate(BLOCK.findall(path.read_text()), 1)]


def run_block(block: Block, env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], env=env, cwd=cwd, capture_output=True,
                          text=True, check=False, timeout=timeout)


def skill_env(tmp: Path) -> dict[str, str]:
    """The environment of a skill's blocks: the operator's shell, less anything that would redirect lego."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LEGO_", "RUN_", "SWE_", "ADAPTER_", "MONITOR_"))
           and k not in {"PROMPT_DATA", "HF_CHECKPOINT", "DATA_ROOT", "RUN_ROOT"}}
    for name, src in (("run", RUNS / "toy-train"), ("other", RUNS / "toy-train"), ("check", RUNS / "rollout-check")):
        shutil.copytree(src, tmp / name)
    work = tmp / "work"
    work.mkdir()
    env.update(REPO=str(REPO), TASKS=str(REPO / "examples" / "tasks"), RUN=str(tmp / "run"),
               OTHER=str(tmp / "other"), CHECK_RUN=str(tmp / "check"), WORK=str(work), COLUMNS="140",
               SWE_AGENT_TIME_BUDGET_SEC="10",
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}")
    return env


# Skills whose blocks another test runs, in this same environment, and whose outputs it checks too: running them
# here again would only double their time (check-tasks: sandboxes and real Claude Code rollouts, ~80 s).
OWN_TEST = {"check-tasks": "tests/tasks/test_skill_check_tasks.py"}


def _skill_param(path: Path) -> object:
    marks = [pytest.mark.slow] if path.parent.name in SLOW else []
    if path.parent.name in OWN_TEST:
        marks.append(pytest.mark.skip(reason=f"run, outputs checked, by {OWN_TEST[path.parent.name]}"))
    return pytest.param(path, id=path.parent.name, marks=marks)


def test_there_are_skills_and_the_slow_list_names_only_existing_ones() -> None:
    names = {p.parent.name for p in SKILL_FILES}
    assert len(names) >= 4
    assert SLOW <= names, f"SLOW names skills that do not exist: {sorted(SLOW - names)}"
    for name, test in OWN_TEST.items():
        assert name in names and name in (REPO / test).read_text(), (name, test)


def test_the_readme_lists_every_skill_and_no_other() -> None:
    listed = set(re.findall(r"\]\(([a-z0-9-]+)/SKILL\.md\)", (SKILLS / "README.md").read_text()))
    assert listed == {p.parent.name for p in SKILL_FILES}


@pytest.mark.parametrize("path", [pytest.param(p, id=p.parent.name) for p in SKILL_FILES])
def test_the_skill_is_in_agent_skills_format(path: Path) -> None:
    text = path.read_text()
    front = FRONT.match(text)
    assert front, f"{path}: must start with front matter '---\\nname: ...\\ndescription: ...\\n---'"
    assert front.group("name") == f"lego-{path.parent.name}", f"{path}: name must be lego-<folder>"
    assert len(front.group("description")) > 40, f"{path}: the description says what and when in a sentence"
    assert "\n## Steps\n" in text, f"{path}: needs a '## Steps' section"
    steps = text.split("\n## Steps\n", 1)[1]
    assert re.search(r"^1\. ", steps, flags=re.MULTILINE), f"{path}: steps are a numbered list"
    blocks = blocks_of(path)
    assert blocks, f"{path}: a skill without a command block cannot be checked"
    assert any(b.skip_reason is None for b in blocks), f"{path}: every block is skipped"
    # A command in a fence that is not ```bash would escape the run below.
    for lang, body in re.findall(r"^ *```(\w*)\n(.*?)^ *```", text, flags=re.DOTALL | re.MULTILINE):
        assert lang == "bash" or not re.search(r"^\s*(lego|\$ lego) ", body, flags=re.MULTILINE), (
            f"{path}: a ```{lang} fence holds lego commands; make it ```bash so the test runs it")


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq missing")
@pytest.mark.parametrize("path", [_skill_param(p) for p in SKILL_FILES])
def test_every_command_block_runs(path: Path, tmp_path: Path) -> None:
    env = skill_env(tmp_path)
    cwd = Path(env["WORK"])
    for block in blocks_of(path):
        if block.skip_reason is not None:
            continue
        res = run_block(block, env, cwd)
        assert res.returncode == 0, (f"skills/{block.skill}/SKILL.md block {block.index} exited {res.returncode}:\n"
                                     f"{block.text}\n--- stdout\n{res.stdout[-4000:]}\n--- stderr\n"
                                     f"{res.stderr[-4000:]}")


# -- the checker itself: it must be able to fail ----------------------------------------------------------------


def test_an_unmarked_failing_block_fails_and_a_marked_one_is_skipped(tmp_path: Path) -> None:
    env = skill_env(tmp_path)
    failing = Block("x", 1, "lego monitor \"$WORK/no-such-run\" --json | jq .run\n")
    assert run_block(failing, env, tmp_path).returncode != 0
    piped = Block("x", 2, "false | cat\n")  # pipefail: a failure on the left of a pipe is not hidden
    assert run_block(piped, env, tmp_path).returncode != 0
    marked = Block("x", 3, "# skill-test: skip — needs a Ray cluster of four nodes\nray start --head\n")
    assert marked.skip_reason == "needs a Ray cluster of four nodes"


@pytest.mark.parametrize("marker", ["# skill-test: skip\n", "# skill-test: skip — \n", "# skill-test: skip slow\n"])
def test_a_skip_marker_without_a_reason_is_refused(marker: str) -> None:
    with pytest.raises(ValueError, match="must say why"):
        _ = Block("x", 4, marker + "lego train\n").skip_reason
