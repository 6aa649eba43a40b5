"""The run store: the run directory's layout, its typed event log and metrics rows, atomic write-new, and
readers that follow a growing run. The bottom layer: it imports only the standard library, pydantic,
``lego_rl.errors`` and ``lego_rl.termination``, so every other package may use it."""

from lego_rl.runstore.events import RunEvent, event_kinds, parse_event
from lego_rl.runstore.files import replace_file, write_new, write_next_free
from lego_rl.runstore.layout import RunDir, RunLayout, safe_name
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
    "Cursor",
    "EventLog",
    "JsonlFollower",
    "MetricsLog",
    "RunDir",
    "RunEvent",
    "RunLayout",
    "RunLogError",
    "StepMetrics",
    "event_kinds",
    "follow_events",
    "follow_metrics",
    "parse_event",
    "read_events",
    "replace_file",
    "safe_name",
    "write_new",
    "write_next_free",
]
