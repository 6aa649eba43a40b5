"""The run store: the run directory's layout, its typed event log and metrics rows, atomic write-new, and
readers that follow a growing run. The bottom layer: it imports only the standard library, pydantic,
``lego_rl.errors`` and ``lego_rl.termination``, so every other package may use it."""

from lego_rl.runstore.checkpoints import (
    Checkpoint,
    checkpoint_dir,
    checkpoints_after,
    latest_checkpoint,
    publish_latest,
)
from lego_rl.runstore.events import RunEvent, event_kinds, parse_event
from lego_rl.runstore.files import replace_file, write_new, write_next_free
from lego_rl.runstore.layout import RolloutFiles, RunDir, RunLayout, safe_name
from lego_rl.runstore.log import (
    Cursor,
    EventLog,
    JsonlFollower,
    MetricsLog,
    RunLogError,
    follow_events,
    follow_metrics,
    read_events,
)
from lego_rl.runstore.metrics import StepMetrics

__all__ = [
    "Checkpoint",
    "Cursor",
    "EventLog",
    "JsonlFollower",
    "MetricsLog",
    "RolloutFiles",
    "RunDir",
    "RunEvent",
    "RunLayout",
    "RunLogError",
    "StepMetrics",
    "checkpoint_dir",
    "checkpoints_after",
    "event_kinds",
    "follow_events",
    "follow_metrics",
    "latest_checkpoint",
    "parse_event",
    "publish_latest",
    "read_events",
    "replace_file",
    "safe_name",
    "write_new",
    "write_next_free",
]
