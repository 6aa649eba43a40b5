"""``lego train``'s start: from a checked config to the session that runs (GRPO or SFT), or to nothing on a
torchrun rank other than 0 (it follows rank 0's trainer calls until rank 0 stops). The CLI drives the session
and renders its progress and summary."""

from __future__ import annotations

from pathlib import Path

from lego_rl.compose.sft_session import SftSession
from lego_rl.compose.train_session import TrainSession, follow_rank_zero_session, start_ranks
from lego_rl.config.resolve import ResolvedConfig
from lego_rl.errors import ConfigError
from lego_rl.runstore import checkpoints_after, latest_checkpoint


def open_training(r: ResolvedConfig) -> TrainSession | SftSession | None:
    """The session ``r`` asks for (``train.sft_data``: SFT), checked up front; None on a torchrun follower rank,
    which has already done its part when this returns. Raises ``ConfigError`` / ``TaskDataError`` on unusable
    settings or data before anything starts."""
    c = r.config
    if c.train.resume:
        refuse_checkpoints_past_latest(Path(c.paths.run_root or "runs/unnamed") / "checkpoints")
    explicit_dp = c.train.data_parallel if r.is_explicit("train.data_parallel") else None
    if start_ranks(c, data_parallel=explicit_dp) > 0:  # torchrun: this rank follows rank 0's trainer calls only
        follow_rank_zero_session(c)
        return None
    return SftSession(r) if c.train.sft_data else TrainSession(r)


def refuse_checkpoints_past_latest(checkpoints: Path) -> None:
    """A resume from a ``latest`` that an operator pointed back (a roll back) would retrain the steps after it and
    then fail mid-run on saving over their checkpoints, which are never overwritten: refuse before anything
    starts, naming them, so that the operator moves them away (and keeps them) first."""
    latest = latest_checkpoint(checkpoints)
    if latest is None:
        orphans = checkpoints_after(checkpoints, -1)
        if orphans:
            # Complete checkpoints that ``latest`` never named (the process died between writing one and
            # publishing it): a resume would start from the initial weights and fail on saving over them.
            raise ConfigError(
                f"{checkpoints} holds {', '.join(orphans)} but no `latest` pointer naming one: point it at "
                f"the one to resume from (`echo {orphans[-1]} > {checkpoints / 'latest'}`), or move them out "
                "of checkpoints/ to start again from the initial weights", parameter="train.resume",
                value=orphans[-1])
        return
    newer = checkpoints_after(checkpoints, latest.step)
    if newer:
        name = latest.path.name
        raise ConfigError(
            f"{checkpoints / 'latest'} names {name}, but {', '.join(newer)} (newer) exist in {checkpoints}: "
            f"resuming would retrain those steps and cannot overwrite their checkpoints; to roll back to {name}, "
            "move them out of checkpoints/ first (or start a new run with model.checkpoint set to the one you "
            "want)", parameter="train.resume", value=name)
