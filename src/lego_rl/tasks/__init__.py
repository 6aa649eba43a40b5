"""Task rows and dataset converters (MiMo parquet, SWE-bench Pro, f2p_script)."""

from lego_rl.tasks.mimo import convert_mimo
from lego_rl.tasks.model import Message, SweProInfo, TaskMetadata, TaskRow
from lego_rl.tasks.patchpaths import patch_paths
from lego_rl.tasks.rows import LoadResult, RowIssue, atomic_write_text, load_tasks, select_ids, write_tasks
from lego_rl.tasks.swepro import convert_swepro

__all__ = [
    "LoadResult",
    "Message",
    "RowIssue",
    "SweProInfo",
    "TaskMetadata",
    "TaskRow",
    "atomic_write_text",
    "convert_mimo",
    "convert_swepro",
    "load_tasks",
    "patch_paths",
    "select_ids",
    "write_tasks",
]
