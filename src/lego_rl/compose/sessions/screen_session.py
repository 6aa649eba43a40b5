"""``lego tasks screen`` rolling out itself: k attempts per task, through the stack training uses.

The policy is the config's (``model.checkpoint`` on the embedded engine, or ``serving.urls``), served
by the same engine, adapter, sandboxes, harness plugins and grader as a training step (``serving_stack``
and ``generate``), each row with its own harness (``metadata.agent``, else ``agent.default_harness``;
``--harness`` for all). The attempts are the rollouts in the run directory (``paths.run_root``), read
from its event log exactly as ``lego tasks screen --run`` reads any run, so the screen is resumable: a
second session in the same directory counts what is there and rolls out only what is missing (a
rollout lost to the infrastructure or interrupted is no attempt, and is rolled out again). When
nothing is missing, no engine starts and nothing is written to the run.

A directory is only reused by the same policy: the keys in ``POLICY_KEYS`` must match its
``config.json``, and a training run (whose weights changed under its rollouts) is refused: screen that
with ``--run``. Rows that cannot be rolled out (a row that does not parse, a repository archive or an
image entry that is not there) are named, with the reason, and nothing is started for them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lego_rl.config.dataset_scan import row_keys
from lego_rl.config.resolve import ResolvedConfig, config_json
from lego_rl.errors import ConfigError, TaskDataError
from lego_rl.images.importer import load_images_json
from lego_rl.compose.rollout_check import rollout_context
from lego_rl.driver.rollout_rows import write_session_row
from lego_rl.driver.runner import ProgressFn, RolloutRunner
from lego_rl.compose.stack import serving_stack
from lego_rl.rollout.generate import RolloutResult, RolloutSpec
from lego_rl.runstore import RunDir, follow_metrics
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.events import ScreenFinished, ServingReady
from lego_rl.runstore.layout import RunLayout
from lego_rl.sandbox.base import ImageSpec
from lego_rl.swe.seed import repo_archive
from lego_rl.swe.task_sandbox import RunProviders
from lego_rl.tasks.model import TaskRow
from lego_rl.tasks.rows import check_ids_unique, finish_selection, load_tasks, parse_row
from lego_rl.tasks.screen import Attempts, TaskScreen, missing_attempts, read_log, screen

POLICY_KEYS = (
    "model.checkpoint", "model.served_name", "model.max_context_tokens", "model.max_response_tokens",
    "model.chat_template_kwargs", "rollout.temperature", "rollout.top_p", "rollout.top_k",
    "agent.time_budget_s", "agent.max_turns", "agent.prompt",
)
"""What makes two sessions' attempts the same experiment: the policy, how it samples, and what bounds an
attempt. A run directory made with other values is not topped up (its attempts would mix two policies)."""


def _trained(layout: RunLayout) -> bool:
    """Whether the directory's metrics rows are a training run's: every train and SFT row holds the policy's
    weight version, which a screening or rollout-check session (one row each, ``driver.rollout_rows``) never
    writes."""
    if not layout.metrics.exists():
        return False
    return any(mc.read(row.values, mc.WEIGHT_VERSION) is not None for row in follow_metrics(layout.metrics).read())


@dataclass(frozen=True)
class BadRow:
    """A dataset row nothing can be rolled out for."""

    row: int
    instance_id: str | None
    reason: str


@dataclass
class ScreenPlan:
    """What a session will do: the rollouts still missing, and what the directory already holds."""

    specs: list[RolloutSpec] = field(default_factory=list)
    reused: int = 0
    """Policy attempts already in the run directory (of the selected tasks, at most k each)."""


class ScreenSession:
    """Top up one run directory to ``k`` attempts per task, then screen the tasks by those attempts."""

    def __init__(self, r: ResolvedConfig, *, k: int, ids: Sequence[str] | None = None,
                 harness: str | None = None) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.r, self.k, self.harness = r, k, harness
        c = r.config
        self.data = Path(c.rollout.prompt_data or "")
        check_ids_unique(ids)
        loaded = finish_selection(load_tasks(self.data, row_keys(r)), list(ids) if ids else None,
                                  source=str(self.data))
        self.dataset_dir = self.data.resolve().parent
        images_path = Path(c.sandbox.images) if c.sandbox.images else None
        self.images: dict[str, ImageSpec] | None = (
            load_images_json(images_path) if images_path is not None and images_path.exists() else None
        )
        wanted = set(ids) if ids else None
        self.bad = [BadRow(i.row, i.instance_id, i.reason) for i in loaded.issues
                    if wanted is None or i.instance_id in wanted]
        self.line_of = self._lines()
        """Each good row's line in the dataset (the first line with its id: a later one is a bad row)."""
        self.rows: list[TaskRow] = []
        for row in loaded.rows:
            reason = self._unusable(row)
            if reason is None:
                self.rows.append(row)
            else:
                self.bad.append(BadRow(self.line_of.get(row.metadata.instance_id, 0), row.metadata.instance_id,
                                       reason))
        self.bad.sort(key=lambda b: b.row)
        self.layout = RunLayout(Path(c.paths.run_root or "runs/unnamed"),
                                Path(c.paths.artifacts) if c.paths.artifacts else None,
                                Path(c.paths.run_log) if c.paths.run_log else None)
        self._check_reusable()

    def _unusable(self, row: TaskRow) -> str | None:
        """Why no rollout of ``row`` can start (its repository archive or image entry is not there)."""
        try:
            repo_archive(row.metadata, self.dataset_dir)
        except TaskDataError as exc:
            return str(exc)
        if self.images is not None and row.metadata.image not in self.images:
            return f"image {row.metadata.image!r} is not in {self.r.config.sandbox.images} (run `lego images`)"
        return None

    def _lines(self) -> dict[str, int]:
        keys = row_keys(self.r)
        found: dict[str, int] = {}
        for number, line in enumerate(self.data.read_text(encoding="utf-8").splitlines(), start=1):
            try:
                found.setdefault(parse_row(json.loads(line), keys).metadata.instance_id, number)
            except (ValueError, TaskDataError):
                continue
        return found

    def _check_reusable(self) -> None:
        """Refuse a directory whose attempts were not made by this policy (or were made while training)."""
        layout = self.layout
        if not layout.holds_run():
            return
        root = layout.root
        if layout.checkpoints.exists() or _trained(layout):
            raise ConfigError(f"{root} is a training run: its rollouts come from weights that changed during it; "
                              "screen it read-only with --run, or screen into a new directory",
                              parameter="paths.run_root", value=str(root))
        try:
            before: dict[str, Any] = json.loads(layout.config().read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{layout.config()} cannot be read ({exc}): cannot tell which policy made the "
                              "attempts in it", parameter="paths.run_root", value=str(root)) from None
        now = config_json(self.r)
        changed = []
        for key in POLICY_KEYS:
            section, name = key.split(".")
            old = before.get(section, {}).get(name, {}).get("value")
            new = now.get(section, {}).get(name, {}).get("value")
            if json.dumps(old, sort_keys=True, default=str) != json.dumps(new, sort_keys=True, default=str):
                changed.append(f"{key} was {old!r}, is {new!r}")
        if changed:
            raise ConfigError(f"{root} holds attempts made with another policy or budget ({'; '.join(changed)}): "
                              "topping it up would mix the two; use a new paths.run_root",
                              parameter="paths.run_root", value=str(root))

    def attempts(self) -> Attempts:
        """The attempts the run directory holds now."""
        found = Attempts()
        if self.layout.events.is_file():
            read_log(self.layout.events, found)
            found.runs.append(self.layout.root)
        return found

    def plan(self) -> ScreenPlan:
        """One spec per missing attempt; rollout ids continue each task's numbering, never reusing one."""
        attempts = self.attempts()
        ids = [r.metadata.instance_id for r in self.rows]
        missing = missing_attempts(ids, attempts, k=self.k)
        planned = ScreenPlan(reused=sum(min(self.k, len(attempts.rewards.get(i, []))) for i in ids))
        for group, row in enumerate(self.rows):
            iid = row.metadata.instance_id
            if iid not in missing:
                continue
            if self.harness:
                row = row.model_copy(update={"metadata": row.metadata.model_copy(update={"agent": self.harness})})
            used = attempts.started.get(iid, set())
            n = 0
            for _ in range(missing[iid]):
                # a started id may have no finish (killed) but has its artifact folder: skip both
                while f"{iid}-s{n}" in used or self.layout.rollout(f"{iid}-s{n}").exists():
                    n += 1
                planned.specs.append(RolloutSpec(row=row, rollout_id=f"{iid}-s{n}", group_index=group, index=n))
                n += 1
        return planned

    async def run(self, specs: Sequence[RolloutSpec], *, concurrency: int,
                  progress: ProgressFn | None = None) -> list[RolloutResult]:
        """Roll ``specs`` out in the run directory (opened, or reopened). Cancelled (SIGTERM, Ctrl-C), every
        rollout in flight cleans up and logs its outcome (``interrupted``: rolled out again next time)."""
        if not specs:
            return []
        c = self.r.config
        run = RunDir.open(self.layout.root, config=config_json(self.r), resume=self.layout.holds_run(),
                          artifacts=self.layout.artifacts_dir, run_log=self.layout.run_log)
        done = 0
        finished: list[RolloutResult] = []
        started_at: float | None = None

        def count(event: Literal["started", "finished"], spec: RolloutSpec, result: RolloutResult | None) -> None:
            nonlocal done
            done += result is not None
            if result is not None:
                finished.append(result)
            if progress is not None:
                progress(event, spec, result)

        stopped = True
        try:
            # One set of sandbox providers for the session, as in training: sandbox.warm_pool serves every attempt.
            async with serving_stack(c) as stack, RunProviders() as providers:
                run.events.emit(ServingReady(adapter=stack.adapter_url, serving=stack.serving_urls))
                started_at = time.time()
                ctx = rollout_context(self.r, stack, run, dataset_dir=self.dataset_dir, images=self.images,
                                      providers=providers)
                results = await RolloutRunner(ctx, concurrency=concurrency).run(specs, count)
                stopped = False
                return results
        finally:
            if started_at is not None:  # the session's rollouts (a stopped one: those that finished) as one row
                write_session_row(run, mc.TASKS_SCREEN, finished, started_at=started_at, finished_at=time.time())
            # `lego monitor` reads the session as finished (or stopped) rather than running
            run.events.emit(ScreenFinished(k=self.k, rollouts=done, stopped=stopped))
            run.close()

    def verdicts(self, *, min_solved: int = 1, max_solved: int | None = None) -> list[TaskScreen]:
        """Every selected task's verdict by its first ``k`` attempts in the directory, then the bad rows."""
        verdicts = screen([r.metadata.instance_id for r in self.rows], self.attempts(), k=self.k,
                          min_solved=min_solved, max_solved=max_solved)
        for v in verdicts:
            v.row = self.line_of.get(v.instance_id)
        bad = [TaskScreen(instance_id=b.instance_id or "", attempts=0, solved=0, pass_rate=None,
                          decision="bad row", row=b.row, detail=b.reason) for b in self.bad]
        return verdicts + bad

    def kept_lines(self, verdicts: Sequence[TaskScreen]) -> list[str]:
        """The dataset lines of the kept tasks, verbatim, in dataset order."""
        numbers = {self.line_of[v.instance_id] for v in verdicts if v.decision == "kept"}
        lines = self.data.read_text(encoding="utf-8").splitlines()
        return [lines[n - 1] for n in sorted(numbers)]
