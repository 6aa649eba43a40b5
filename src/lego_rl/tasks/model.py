"""The task row: one JSONL line in the reference example's ``prompt`` / ``label`` / ``metadata`` shape.

Only ``prompt`` reaches the agent, and it holds only the public problem statement. Everything the
grader needs (test patch, test command, SWE-bench Pro scripts, an f2p script) lives in ``metadata``,
which the rollout passes to the grader and never into the agent sandbox.

Three grading kinds share the row:

* ``official`` (MiMo and alike): reset the test patch's paths, apply it, run ``eval_cmd``.
* ``swepro``: run the instance's ``run_script`` and judge fail-to-pass/pass-to-pass by its parser.
* ``f2p_script``: run a self-contained pytest file; its exit status is the verdict.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lego_rl.tasks.patchpaths import check_patch_structure, patch_paths

GradingKind = Literal["official", "swepro", "f2p_script"]


class Message(BaseModel):
    """One chat message of the prompt."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user"]
    content: str = Field(min_length=1)


class SweProInfo(BaseModel):
    """SWE-bench Pro grading data; ``run_script`` and ``parser`` are host paths copied into the grader."""

    model_config = ConfigDict(extra="allow")
    before_repo_set_cmd: str = ""
    selected_test_files: list[str] = Field(default_factory=list)
    fail_to_pass: list[str] = Field(default_factory=list)
    pass_to_pass: list[str] = Field(default_factory=list)
    run_script: str
    parser: str

    @model_validator(mode="after")
    def _has_tests(self) -> SweProInfo:
        if not self.fail_to_pass and not self.pass_to_pass:
            raise ValueError("swepro needs at least one fail_to_pass or pass_to_pass test name")
        return self


class TaskMetadata(BaseModel):
    """Grading payload and sandbox facts of one task. Unknown keys are kept (``extra="allow"``)."""

    model_config = ConfigDict(extra="allow")
    instance_id: str = Field(min_length=1)
    dataset: str = ""
    image: str = Field(min_length=1)
    """Image reference as the dataset names it after mapping (key of ``images.json``)."""
    workdir: str = "/testbed"
    """Repository working directory inside the image (the dataset's, not the image's entrypoint's)."""
    problem_statement: str = Field(min_length=1)
    eval_cmd: str | None = None
    """Shell command run in ``workdir`` as ``eval_user``; exit status 0 means solved."""
    eval_user: str = "root"
    test_patch: str = ""
    pre_commands: list[str] = Field(default_factory=list)
    """Run as root in both the agent and the grader sandbox, so the agent's diff has the same base."""
    swepro: SweProInfo | None = None
    f2p_script: str | None = None
    reference_patch: str | None = None
    """A known-good fix, when the dataset has one; ``lego tasks check`` proves it scores 1."""
    agent: str | None = None

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"workdir {v!r} must be an absolute path inside the image")
        return v.rstrip("/") or "/"

    @field_validator("test_patch")
    @classmethod
    def _safe_test_patch(cls, v: str) -> str:
        patch_paths(v)  # raises on absolute or '..' paths
        check_patch_structure(v, what="test patch")  # a patch git would refuse (or misread) is bad task data
        return v

    @field_validator("reference_patch")
    @classmethod
    def _wellformed_reference(cls, v: str | None) -> str | None:
        if v is not None:
            check_patch_structure(v, what="reference patch")
        return v

    @model_validator(mode="after")
    def _gradable(self) -> TaskMetadata:
        if self.swepro is None and self.f2p_script is None and not self.eval_cmd:
            raise ValueError("metadata needs eval_cmd (or swepro, or f2p_script) so the grader can decide")
        if self.swepro is not None and self.f2p_script is not None:
            raise ValueError("metadata has both swepro and f2p_script; a row has one grading kind")
        return self

    @property
    def kind(self) -> GradingKind:
        if self.swepro is not None:
            return "swepro"
        if self.f2p_script is not None:
            return "f2p_script"
        return "official"

    @property
    def test_paths(self) -> list[str]:
        """Repository paths the official test patch touches (reset before it is applied)."""
        return patch_paths(self.test_patch)


class TaskRow(BaseModel):
    """One training/evaluation task, as written by ``lego tasks prepare`` and read by the rollout."""

    model_config = ConfigDict(extra="forbid")
    prompt: list[Message] = Field(min_length=1)
    label: str = Field(min_length=1)
    metadata: TaskMetadata

    @model_validator(mode="after")
    def _label_is_id(self) -> TaskRow:
        if self.label != self.metadata.instance_id:
            raise ValueError(f"label {self.label!r} differs from metadata.instance_id {self.metadata.instance_id!r}")
        return self

    @classmethod
    def build(cls, *, problem_statement: str, **metadata: Any) -> TaskRow:
        """A row whose prompt is exactly the public problem statement."""
        meta = TaskMetadata(problem_statement=problem_statement, **metadata)
        return cls(
            prompt=[Message(role="user", content=problem_statement)], label=meta.instance_id, metadata=meta
        )

    def to_json_line(self) -> str:
        return self.model_dump_json(exclude_none=True)
