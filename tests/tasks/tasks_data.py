"""Builders for small dataset files of the real shapes (see FIELD-NOTES "Task row formats")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

TEST_PATCH = """diff --git a/tests/test_calc.py b/tests/test_calc.py
new file mode 100644
--- /dev/null
+++ b/tests/test_calc.py
@@ -0,0 +1,2 @@
+def test_add():
+    assert 1 + 1 == 2
"""


def mimo_instance(iid: str, **over: Any) -> dict[str, Any]:
    inst = {
        "instance_id": iid,
        "problem_statement": f"Fix the bug in {iid}.",
        "docker_image": f"mimo/{iid}:latest",
        "cwd": "/testbed",
        "test_patch": TEST_PATCH,
        "test_command": "python -m pytest -q tests/test_calc.py",
    }
    inst.update(over)
    return inst


def write_mimo(d: Path, instances: list[Any], mapping: dict[str, str] | None = None) -> Path:
    """code.parquet (struct column extra_info.instance_json, plus the other columns) + image-mapping.jsonl."""
    d.mkdir(parents=True, exist_ok=True)
    extra = []
    for inst in instances:
        ij = inst if isinstance(inst, str) else json.dumps(inst)
        extra.append({"index": len(extra), "instance_json": ij})
    table = pa.table(
        {
            "data_source": ["mimo-code"] * len(extra),
            "prompt": [[{"role": "user", "content": "ignored"}]] * len(extra),
            "extra_info": extra,
        }
    )
    pq.write_table(table, d / "code.parquet")
    if mapping is None:
        mapping = {
            f"mimo/{i['instance_id']}:latest": f"docker.io/xiaomimimo/mimo-v2.6-rl-oss:{i['instance_id']}"
            for i in instances
            if isinstance(i, dict) and "instance_id" in i
        }
    lines = [json.dumps({"dataset_image": k, "dockerhub_image": v}) for k, v in mapping.items()]
    (d / "image-mapping.jsonl").write_text("\n".join(lines) + "\n")
    return d
