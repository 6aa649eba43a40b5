"""Workspace preparation, patch capture and the fresh-sandbox grader."""

from lego_rl.swe.grader import GradeResult, grade
from lego_rl.swe.patch import Snapshot, capture_patch, take_snapshot
from lego_rl.swe.workspace import prepare_workspace, strip_future_history

__all__ = [
    "GradeResult",
    "Snapshot",
    "capture_patch",
    "grade",
    "prepare_workspace",
    "strip_future_history",
    "take_snapshot",
]
