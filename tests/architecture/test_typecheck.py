"""The type checker as `make test` runs it: mypy over src/lego_rl and every plugin (pyproject [tool.mypy]).

Runs from the repository root with mypy's incremental cache (.mypy_cache/): about 35 s cold on two cores,
a few seconds after that.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_package_and_plugins_type_check() -> None:
    result = mypy()  # the paths are the config's `files`
    assert result.returncode == 0, \
        f"mypy found type errors (fix them; do not silence them):\n{result.stdout}{result.stderr}"
    assert "Success: no issues found" in result.stdout


def test_the_configured_checker_reports_a_type_error(tmp_path: Path) -> None:
    # Guards the configuration: a setting that switched checking off would make the test above pass vacuously.
    bad = tmp_path / "planted.py"
    bad.write_text("def f(limit: float | None) -> float:\n    return limit + 300.0\n")
    result = mypy("--no-incremental", str(bad))
    assert result.returncode == 1
    assert 'planted.py:2: error: Unsupported operand types for + ("None" and "float")' in result.stdout
