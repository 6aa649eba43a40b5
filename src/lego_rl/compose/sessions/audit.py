"""``lego audit``: check a run's whole chain, engine → rollouts → trainer tensors → optimizer → engine, from its
run directory (a run trained with ``train.audit = true``).

Inputs, all written by the run: ``audit/rank-<r>.jsonl`` (``train.audit``: one row per ``train_step`` on every
trainer rank), ``audit/engine-*.jsonl`` (the engines' served-token logs: the embedded engine's, or ``lego serve
--served-log``), ``events.jsonl`` (which rollouts each step took, their groups, rewards and terminations, the
weight version of every step) and ``metrics.jsonl`` (consistency figures and timings).

Checks (each passes or fails with the first offending items named):

* ``ranks_recorded``: ranks 0..N-1 each wrote one row per optimizer step, and N is the trainer's TP × DP;
* ``tokens_match_engine``: every run of trained tokens in rank 0's tensors is an engine reply, token for token,
  with its logprobs equal (as float32, what the tensors hold) — nothing re-tokenised, re-scored or shifted;
* ``advantages_group_normalised``: each rollout's advantage is one value, equal to (R − mean) / (std + 1e-6)
  over the *distinct* admitted rollouts of its group (population std), recomputed here from the events;
* ``optimizer_ran_every_rank``: on every rank the optimizer's own step counter moved by one per step;
* ``parameters_changed_iff_signal``: on every rank the parameters changed exactly when some advantage of the
  step was non-zero (and the ranks agree on that);
* ``engines_served_synced_weights``: every trained token was sampled under a weight version the step could use
  (from the version its rollout started on up to the step's own); in a synchronous run every reply served while
  a step rolled out (by the replies' and the events' timestamps) carries the version that step started on (or the
  one its own sync made, for a next-step reply racing the step's end event), so
  each step after a trained step was served the new weights, whether or not it trained itself.

Figures: consistency per step, the step time split (rollout / train / sync) and model FLOP/s per trainer GPU
(6 · parameters · packed sequence tokens / train-phase time / trainer ranks; parameters counted from the
checkpoint's safetensors; the train phase includes the logprob recomputation, so this understates the update's).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from lego_rl.errors import ConfigError
from lego_rl.runstore import StepMetrics
from lego_rl.runstore import metric_catalog as mc
from lego_rl.runstore.events import BatchTaken, RolloutFinished, RolloutStarted, StepFinished, StepStarted
from lego_rl.runstore.files import write_next_free
from lego_rl.runstore.layout import RunLayout
from lego_rl.runstore.log import follow_metrics, read_events

ADV_EPS = 1e-6
"""The GRPO std epsilon of ``train.advantages.grpo_advantages``."""
ADV_TOL = 1e-4
"""Advantages are float32 in the tensors; the recomputation is float64."""


class Check(BaseModel):
    name: str
    passed: bool
    detail: str
    """What was checked, in numbers, or the first offending items."""


class AuditReport(BaseModel):
    run_root: str
    passed: bool
    checks: list[Check]
    ranks: int
    steps_trained: int
    figures: dict[str, Any] = Field(default_factory=dict)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n} is not JSON ({exc}): a torn write? the audit cannot trust this file",
                              parameter="run_dir", value=str(path)) from None
    return rows


def _version(label: str) -> int:
    """An engine's weight-version label as the trainer's number (``default``: the loaded checkpoint, 0)."""
    return int(label) if label.isdigit() else 0


def _f32(values: Iterable[float]) -> list[float]:
    return np.asarray(list(values), dtype=np.float32).tolist()


def _first(items: list[str], n: int = 3) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return "; ".join(items[:n]) + more


def _param_count(root: Path, config: dict[str, Any]) -> int | None:
    """Parameters of the trained model, from the newest checkpoint's safetensors headers (else the base model's)."""
    candidates = sorted((root / "checkpoints").glob("step-*/model*.safetensors"))
    if not candidates:
        base = config.get("model", {}).get("checkpoint")
        if isinstance(base, str) and Path(base).is_dir():
            candidates = sorted(Path(base).glob("model*.safetensors"))
    if not candidates:
        return None
    folder = candidates[-1].parent
    total = 0
    for f in sorted(folder.glob("model*.safetensors")):
        with f.open("rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        for name, meta in header.items():
            if name != "__metadata__":
                total += math.prod(meta["shape"])
    return total


class _Run:
    """What the audit reads, parsed once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        audit = RunLayout(root).audit
        rank_files = sorted(audit.glob("rank-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))
        if not rank_files:
            raise ConfigError(f"{audit} has no rank-*.jsonl: the run was not trained with train.audit = true (or "
                              "never reached a training step)", parameter="train.audit", value=str(root))
        self.ranks = {int(p.stem.split("-")[1]): _jsonl(p) for p in rank_files}
        engine_files = sorted(audit.glob("engine-*.jsonl"))
        if not engine_files:
            raise ConfigError(f"{audit} has no engine-*.jsonl: the embedded engine writes it with train.audit = "
                              "true; a separate engine needs `lego serve --served-log RUN/audit/engine-<name>.jsonl`",
                              parameter="train.audit", value=str(root))
        self.engine = [r for f in engine_files for r in _jsonl(f)]
        layout = RunLayout(root)
        config_path = layout.config()
        # config.json holds {section: {key: {"value": ..., "source": ...}}}: the audit needs the values.
        raw = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.config: dict[str, Any] = {
            sec: {k: (v.get("value") if isinstance(v, dict) and "value" in v else v) for k, v in keys.items()}
            for sec, keys in raw.items() if isinstance(keys, dict)}
        self.sources: dict[str, str] = {
            f"{sec}.{k}": str(v.get("source")) for sec, keys in raw.items() if isinstance(keys, dict)
            for k, v in keys.items() if isinstance(v, dict) and "source" in v}
        events = read_events(layout.events)
        self.group_of = {e.rollout_id: e.group_index for e in events if isinstance(e, RolloutStarted)}
        self.finished = {e.rollout_id: e for e in events if isinstance(e, RolloutFinished)}
        self.batches = {e.step: e for e in events if isinstance(e, BatchTaken)}
        self.step_started = {e.step: e for e in events if isinstance(e, StepStarted)}
        self.step_finished = {e.step: e for e in events if isinstance(e, StepFinished)}
        self.metrics = {m.step: m for m in follow_metrics(layout.metrics).read()}
        self.trained_steps = sorted(s for s, e in self.step_finished.items() if e.trained)
        # A loop step may take several optimizer steps: each rank-0 row belongs to the step whose batch holds
        # its rollouts.
        step_of = {rid: s for s, b in self.batches.items() for rid in b.rollout_ids}
        self.rows_by_step: list[tuple[int, dict[str, Any]]] = []
        for row in self.ranks.get(0, []):
            steps = {step_of.get(rid, -1) for rid in row.get("rollout_ids", [])}
            self.rows_by_step.append((steps.pop() if len(steps) == 1 else -1, row))
        self.first_version = self.step_started[min(self.step_started)].weight_version if self.step_started else 0
        self.optimizer_steps = int(sum(_read(self.metrics.get(s), mc.OPTIMIZER_STEPS) or 1 for s in self.trained_steps))


def _read(row: StepMetrics | None, metric: mc.Metric) -> float | None:
    """A step's declared metric (None: the step has no row, or the row not that value)."""
    return mc.read(row.values if row is not None else {}, metric)


def _version_after(run: _Run, policy: int) -> int:
    """The weight version the engines serve once ``policy`` steps are done (trained or not)."""
    done = [s for s in run.step_finished if s < policy]
    return run.step_finished[max(done)].weight_version if done else run.first_version


def _check_ranks(run: _Run) -> Check:
    train = run.config.get("train", {})
    expected = int(train.get("tensor_parallel") or 1) * int(train.get("pipeline_parallel") or 1)
    # Only a DP size the operator set is a promise about the rank count (resolution derives one from cluster.*,
    # which torchrun does not read).
    explicit = run.sources.get("train.data_parallel", "default") not in ("default", "trainer GPUs / (TP × PP)")
    dp = train.get("data_parallel") if explicit else None
    ranks = sorted(run.ranks)
    problems = []
    if ranks != list(range(len(ranks))):
        problems.append(f"rank files {ranks} are not 0..{len(ranks) - 1}")
    if dp is not None and expected * int(dp) != len(ranks):
        problems.append(f"TP × PP × DP = {expected * int(dp)} but {len(ranks)} ranks recorded")
    elif len(ranks) % expected:
        problems.append(f"{len(ranks)} ranks recorded, not a multiple of TP × PP = {expected}")
    calls = {r: len(rows) for r, rows in run.ranks.items()}
    if len(set(calls.values())) > 1:
        problems.append(f"ranks recorded different numbers of steps: {calls}")
    if calls.get(0, 0) != run.optimizer_steps:
        problems.append(f"rank 0 recorded {calls.get(0, 0)} optimizer steps, the metrics say {run.optimizer_steps} "
                        f"over {len(run.trained_steps)} trained steps")
    unplaced = [row["call"] for s, row in run.rows_by_step if s < 0]
    if unplaced:
        problems.append(f"rank-0 calls {unplaced[:4]} train rollouts of no single step's batch")
    return Check(name="ranks_recorded", passed=not problems,
                 detail=_first(problems) if problems else f"{len(ranks)} ranks × {calls.get(0, 0)} optimizer steps")


def _engine_index(run: _Run) -> dict[tuple[int, ...], list[dict[str, Any]]]:
    index: dict[tuple[int, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in run.engine:
        index[tuple(rec["token_ids"])].append(rec)
    return index


def _token_versions(rec: dict[str, Any]) -> set[int]:
    return {_version(str(span["version"])) for span in rec.get("weight_versions", [])}


def _check_tokens_and_versions(run: _Run) -> tuple[Check, Check, dict[int, list[int]]]:
    index = _engine_index(run)
    missing: list[str] = []
    versions_bad: list[str] = []
    runs_matched = tokens_matched = 0
    versions_by_step: dict[int, list[int]] = {}
    for step, row in run.rows_by_step:
        batch = run.batches.get(step)
        # started_policies count steps completed (trained or not), not weight versions: map them.
        started = ({rid: _version_after(run, p) for rid, p in zip(batch.rollout_ids, batch.started_policies,
                                                                  strict=True)} if batch else {})
        step_version = run.step_started[step].weight_version if step in run.step_started else None
        seen: set[int] = set()
        for entry in row.get("tokens") or []:
            rid = entry["rollout_id"]
            for k, tok_run in enumerate(entry["runs"]):
                ids = tuple(tok_run["token_ids"])
                want = _f32(tok_run["logprobs"])
                hits = [rec for rec in index.get(ids, []) if _f32(rec["logprobs"]) == want]
                if not hits:
                    near = index.get(ids)
                    why = "logprobs differ" if near else "no engine reply has these token ids"
                    missing.append(f"step {step} rollout {rid} run {k} ({len(ids)} tokens): {why}")
                    continue
                runs_matched += 1
                tokens_matched += len(ids)
                vs = set().union(*(_token_versions(rec) for rec in hits))
                seen |= vs
                low = started.get(rid, 0)
                high = step_version if step_version is not None else max(vs)
                if not vs or min(vs) < low or max(vs) > high:
                    versions_bad.append(f"step {step} rollout {rid}: sampled under versions {sorted(vs)}, the step "
                                        f"may use {low}..{high}")
        versions_by_step[step] = sorted(seen | set(versions_by_step.get(step, [])))
    # A trained step must reach the engines before the next step samples: the next step's tokens are newer.
    for prev, nxt in zip(run.trained_steps, run.trained_steps[1:], strict=False):
        after = run.step_finished[prev].weight_version
        if nxt in versions_by_step and versions_by_step[nxt] and max(versions_by_step[nxt]) < after \
                and run.config.get("rollout", {}).get("max_staleness", 1) == 0:
            versions_bad.append(f"step {nxt} was served versions {versions_by_step[nxt]} although step {prev} "
                                f"had synced version {after} (synchronous run)")
    # Synchronous runs: every reply the engines finished while step s rolled out (between its step_started and
    # step_finished events) must carry the version step s started on. This covers the steps that did not train
    # too: step 2 is served step 1's weights whether or not step 2 itself carries signal.
    served_by_step: dict[int, dict[int, int]] = {}
    if run.config.get("rollout", {}).get("max_staleness", 1) == 0:
        for step in sorted(run.step_started):
            start = run.step_started[step].ts
            end = run.step_finished[step].ts if step in run.step_finished else float("inf")
            started_on = run.step_started[step].weight_version
            counts: dict[int, int] = defaultdict(int)
            for rec in run.engine:
                if "ts" in rec and start <= rec["ts"] <= end:
                    for v in _token_versions(rec):
                        counts[v] += 1
            served_by_step[step] = dict(counts)
            # The step's own sync happens before its step_finished event: a next-step reply racing that event
            # may carry the new version inside this window. Newer is legitimate; only older is stale.
            synced = run.step_finished[step].weight_version if step in run.step_finished else started_on
            wrong = {v: n for v, n in counts.items() if v not in (started_on, synced)}
            if wrong:
                versions_bad.append(f"step {step} started on version {started_on}, but the engines served "
                                    f"{sum(wrong.values())} of its replies under {sorted(wrong)}")
    tokens = Check(name="tokens_match_engine", passed=not missing and runs_matched > 0,
                   detail=_first(missing) if missing else
                   f"{runs_matched} runs, {tokens_matched} tokens equal to engine replies (ids and float32 logprobs)")
    versions = Check(name="engines_served_synced_weights", passed=not versions_bad and runs_matched > 0,
                     detail=_first(versions_bad) if versions_bad else
                     "versions per trained step: " + ", ".join(f"step {s}: {v}" for s, v in versions_by_step.items())
                     + ("; replies per step by version: " + ", ".join(
                         f"step {s}: " + " ".join(f"v{v}×{n}" for v, n in sorted(c.items()))
                         for s, c in served_by_step.items()) if served_by_step else ""))
    return tokens, versions, versions_by_step


def _expected_advantages(run: _Run, step: int) -> dict[str, float]:
    batch = run.batches.get(step)
    if batch is None:
        return {}
    groups: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for rid in batch.rollout_ids:
        fin = run.finished.get(rid)
        if fin is None or fin.infrastructure_failure:  # excluded from statistics and loss (the default policy)
            continue
        groups[run.group_of.get(rid, 0)].append((rid, 0.0 if fin.reward is None else float(fin.reward)))
    out: dict[str, float] = {}
    for members in groups.values():
        distinct = dict(members)  # one entry per rollout id, however many segments it has
        rewards = np.array(list(distinct.values()), dtype=np.float64)
        mean, std = rewards.mean(), rewards.std()
        for rid, r in distinct.items():
            out[rid] = 0.0 if np.ptp(rewards) == 0 else float((r - mean) / (std + ADV_EPS))
    return out


def _check_advantages(run: _Run) -> Check:
    bad: list[str] = []
    checked = 0
    for step, row in run.rows_by_step:
        expected = _expected_advantages(run, step)
        for entry in row.get("tokens") or []:
            rid, values = entry["rollout_id"], entry["advantages"]
            checked += 1
            if len(values) != 1:
                bad.append(f"step {step} rollout {rid} has {len(values)} advantage values {values[:4]}")
            elif rid not in expected:
                bad.append(f"step {step} rollout {rid} is trained but not an admitted rollout of the step's batch")
            elif abs(values[0] - expected[rid]) > ADV_TOL * max(1.0, abs(expected[rid])):
                bad.append(f"step {step} rollout {rid}: advantage {values[0]:.6g}, group-normalised {expected[rid]:.6g}")
    return Check(name="advantages_group_normalised", passed=not bad and checked > 0,
                 detail=_first(bad) if bad else f"{checked} rollouts' advantages equal (R − mean)/(std + 1e-6) over "
                 "their group's distinct admitted rollouts")


def _check_optimizer_and_params(run: _Run) -> tuple[Check, Check]:
    opt_bad: list[str] = []
    param_bad: list[str] = []
    for rank, rows in sorted(run.ranks.items()):
        for row in rows:
            if row["optimizer_steps_after"] != row["optimizer_steps_before"] + 1:
                opt_bad.append(f"rank {rank} call {row['call']}: optimizer steps {row['optimizer_steps_before']} -> "
                               f"{row['optimizer_steps_after']}")
            changed = row["parameters_changed"] > 0
            if changed != row["nonzero_advantage"]:
                param_bad.append(f"rank {rank} call {row['call']}: {row['parameters_changed']}/{row['parameters']} "
                                 f"parameters changed with {'some' if row['nonzero_advantage'] else 'no'} non-zero "
                                 "advantage")
    by_call: dict[int, set[bool]] = defaultdict(set)
    for rows in run.ranks.values():
        for row in rows:
            by_call[row["call"]].add(bool(row["nonzero_advantage"]))
    param_bad += [f"call {c}: the ranks disagree on whether an advantage was non-zero" for c, v in by_call.items()
                  if len(v) > 1]
    n = sum(len(rows) for rows in run.ranks.values())
    return (Check(name="optimizer_ran_every_rank", passed=not opt_bad and n > 0,
                  detail=_first(opt_bad) if opt_bad else f"{n} rank-steps, each +1 optimizer step"),
            Check(name="parameters_changed_iff_signal", passed=not param_bad and n > 0,
                  detail=_first(param_bad) if param_bad else
                  f"{n} rank-steps: parameters changed exactly when an advantage was non-zero"))


def _figures(run: _Run) -> dict[str, Any]:
    world = len(run.ranks)
    params = _param_count(run.root, run.config)
    steps: dict[str, Any] = {}
    for step in sorted(run.metrics):
        v = run.metrics[step].values
        shown = (mc.REWARD_MEAN, mc.TIME_ROLLOUT_S, mc.TIME_TRAIN_S, mc.TIME_SYNC_S, mc.TIME_STEP_S, mc.TOKENS,
                 mc.WEIGHT_VERSION, *mc.CONSISTENCY.values())
        row: dict[str, Any] = {str(m): x for m in shown if (x := mc.read(v, m)) is not None}
        seq = sum(r.get("sequence_tokens", 0) for s, r in run.rows_by_step if s == step)
        if seq:
            row["sequence_tokens"] = seq
        t_train = mc.read(v, mc.TIME_TRAIN_S)
        if params and seq and t_train:
            # 6·N per token (forward + backward) over the train phase, which also holds the logprob recompute.
            row["model_tflops_per_gpu"] = 6 * params * seq / t_train / world / 1e12
        steps[str(step)] = row
    return {"parameters": params, "trainer_ranks": world, "steps": steps}


def audit_run(root: Path) -> AuditReport:
    """Run every check over the run directory ``root`` (see the module docstring)."""
    run = _Run(Path(root))
    tokens, versions, _ = _check_tokens_and_versions(run)
    optimizer, params = _check_optimizer_and_params(run)
    checks = [_check_ranks(run), tokens, _check_advantages(run), optimizer, params, versions]
    return AuditReport(run_root=str(root), passed=all(c.passed for c in checks), checks=checks,
                       ranks=len(run.ranks), steps_trained=len(run.trained_steps), figures=_figures(run))


def write_report(report: AuditReport) -> Path:
    """``audit/report.json`` of the run (``report.1.json`` ... when one exists: reports are never replaced)."""
    return write_next_free(RunLayout(Path(report.run_root)).audit, "report.json", report.model_dump_json(indent=2) + "\n")
