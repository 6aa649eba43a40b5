"""One pydantic model per section of ``lego.toml``.

Every field's docstring is what ``lego validate`` and ``lego config show`` print, so it states units,
the default and what it interacts with. Defaults follow the reference coding-agent example's launcher.
Values left ``None`` where noted are filled by ``resolve.derive()`` from other keys.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

InfraFailurePolicy = Literal["exclude", "zero_reward"]
DEFAULT_PROMPT = (
    "Read the problem statement in {problem_file}. Edit the source code in {workdir} to fix it, run the "
    "relevant tests to check your change, and finish with a short summary of what you changed."
)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class ModelConfig(Section):
    checkpoint: str = "lego:tiny"
    """HF checkpoint directory of the policy (weights, tokenizer, chat template). `lego:tiny` builds the
    offline tiny Qwen3-architecture test model on first use and caches it."""
    max_context_tokens: int = Field(default=65536, gt=0)
    """Context window in tokens for a whole multi-turn trajectory; passed to the CLIs and the adapter."""
    max_response_tokens: int = Field(default=8192, gt=0)
    """Maximum output tokens per model turn; the adapter clamps it to what remains of the context."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for the chat template on every turn (JSON object)."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = "medium"
    """Template `reasoning_effort` unless `chat_template_kwargs` sets one; some templates default to xhigh."""
    moe: bool | None = None
    """Whether the policy is a mixture-of-experts model; read from the checkpoint's config.json when unset."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weight dtype for serving and training; auto = float32 on CPU, bfloat16 on GPU."""
    served_name: str = "lego-policy"
    """Model name the adapter reports to the coding CLIs."""


class ServingConfig(Section):
    backend: Literal["embedded", "vllm"] = "embedded"
    """`embedded`: lego's transformers engine in-process (CPU or one GPU). `vllm`: external vLLM servers
    started with `--enable-scale-out` at `urls`."""
    urls: list[str] = Field(default_factory=list)
    """Base URLs of the vLLM replicas (backend=vllm). Sessions stick to one replica."""
    host: str = "127.0.0.1"
    """Listening address of the embedded engine."""
    port: int = Field(default=0, ge=0, le=65535)
    """Listening port of the embedded engine. 0 (the default): a free port the kernel picks, so runs on one
    host never collide; the run's `serving_ready` event records the URL it got. A fixed port another process
    holds stops the launch with one line naming this key."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device of the embedded engine."""
    max_batch_size: int = Field(default=8, ge=1)
    """Requests the embedded engine decodes together."""
    precision: Literal["auto", "weights", "trainer"] = "auto"
    """How the embedded engine computes. `weights`: everything in `model.dtype`. `trainer`: fp32 weights with
    matmuls and attention in bf16 on CUDA, exactly the torch trainer's autocast recipe (fp32 throughout when
    `train.precision = "fp32"`), so rollout and trainer
    logprobs agree (RESULTS.md: mean |Δ| 0.003 against 0.008 for pure bf16; fp32 on CPU). `auto`: `trainer`
    on CUDA when `model.dtype` is auto, else `weights`."""
    tool_call_parser: str = "qwen3_coder"
    """Parser for tool calls in the sampled text, by vLLM's name (`--tool-call-parser`); must match the served
    model. With vLLM importable in lego's process every vLLM parser works, else the built-in qwen3_coder and
    hermes (docs/serving.md)."""
    reasoning_parser: str = "qwen3"
    """Parser for reasoning in the sampled text, by vLLM's name (`--reasoning-parser`), or none. Without vLLM
    in lego's process: qwen3 (<think> blocks) or none."""
    request_timeout_s: float = Field(default=900.0, gt=0)
    """Deadline of one generate call including retries."""
    disable_cuda_graph: bool = False
    """Disable vLLM decode CUDA graphs (VLLM_DISABLE_CUDA_GRAPH) when diagnosing graph compatibility."""
    cuda_graph_max_batch: int = Field(default=4, ge=1)
    """Largest decode batch captured in a CUDA graph."""


class AdapterConfig(Section):
    bind_host: str = "0.0.0.0"
    """Address the adapter listens on."""
    port: int = Field(default=18091, ge=0, le=65535)
    """Port the adapter listens on."""
    public_host: str = "auto"
    """Address advertised to sandboxes; `auto` = this node's routable IP (set it when that is not reachable)."""
    model_aliases: list[str] = Field(default_factory=list)
    """Model names clients may send besides `model.served_name` without a warning (the served model answers
    every request whatever name it carries; any other name is logged once per session, naming this key)."""
    max_requests_per_session: int = Field(default=500, ge=1)
    """Requests one session may make before it is refused (stops CLIs that loop)."""
    max_body_mb: float = Field(default=32.0, gt=0)
    """Largest accepted request body in MiB (Content-Length or chunked); larger ones are answered 413 naming
    this key. `lego adapter --max-body-mb` is the same limit for the standalone adapter."""


class AgentConfig(Section):
    """Harness-neutral agent settings; each harness's own options live in its `[harness.<name>]` table."""

    default_harness: str = "claude_code"
    """Harness used when a row's `metadata.agent` is unset (claude_code, codex, opencode, openhands)."""
    time_budget_s: float = Field(default=1200.0, gt=0)
    """Wall-clock budget of the coding CLI per rollout."""
    max_turns: int = Field(default=40, ge=1)
    """Turn limit passed to the CLI."""
    prompt: str = DEFAULT_PROMPT
    """Agent instruction; `{problem}` (the statement), `{problem_file}` (its path in the sandbox) and `{workdir}` are
    filled in. Official tests stay hidden."""
    sandbox_image_metadata_key: str = "image"
    """Row metadata key naming the task image (`metadata.<key>`), read by the row loader as its image."""


class SandboxConfig(Section):
    provider: str = "sunabako"
    """Provider for agent and grader sandboxes: sunabako (clusters), bwrap (one machine), e2b."""
    cluster: str | None = None
    """sunabako cluster.json (default $DATA_ROOT/cluster.json; unset with no file = the local node)."""
    images: str | None = None
    """images.json mapping task images to imported root filesystems (default $DATA_ROOT/images.json)."""
    memory_mb: int = Field(default=2048, gt=0)
    """Memory per sandbox in MB."""
    disk_mb: int | None = Field(default=None, ge=64)
    """bwrap: cap on what one sandbox may write, in MiB (its writable layer becomes a loop-mounted ext4 of this
    size: a policy that fills its disk gets ENOSPC in its own sandbox instead of filling the host's). Count the
    harness install (Claude Code, Codex ~200 MB; OpenHands ~600 MB) and the task's build output. None = no cap."""
    allow_test_memory: bool | None = None
    """sunabako only, must be set explicitly: false = cgroup enforcement (production); true = RSS
    supervision for functional tests on machines without delegated cgroups."""
    boot_concurrency: int = Field(default=2, ge=1)
    """Sandboxes booting at the same time."""
    warm_pool: int = Field(default=0, ge=0)
    """sunabako: sandboxes created ahead per image and options, shared by a run's rollouts and graders
    (0 = off). A create from the pool takes milliseconds instead of a rootfs copy; each pooled sandbox holds
    its memory reservation on the node while it waits. Emptied when the run ends."""
    lifetime_s: float | None = None
    """Hard lifetime of a sandbox; must outlive the rollout guard (default: guard + 300 s)."""
    network: Literal["auto", "adapter", "host", "none"] = "auto"
    """Agent sandboxes' network. `adapter`: only the adapter's address and `network_allow` are reachable
    (bwrap, local sunabako node); `host`: everything the host reaches (sunabako clusters, e2b); `none`:
    loopback only; `auto`: `adapter` where the adapter is local (bwrap, sunabako without cluster.json), else
    `host`. Graders always get `none`."""
    network_allow: list[str] = Field(default_factory=list)
    """Extra `ADDRESS:PORT` endpoints (IP literals: no DNS inside) agent sandboxes may reach under `adapter`."""
    sunabako_state_dir: str = "/var/lib/sunabako"
    """sunabako: the local node's state directory (used when no cluster.json is set)."""
    rootfs: str | None = None
    """bwrap only: default root filesystem for images without an images.json entry (unset = host root)."""
    e2b_api_key: SecretStr | None = None
    """E2B API key (provider e2b)."""


class GraderConfig(Section):
    timeout_s: float = Field(default=180.0, gt=0)
    """Official grader timeout per rollout."""
    provider: str | None = None
    """Sandbox provider for grading (default: the agent's provider)."""
    max_output_kb: int = Field(default=1024, ge=1)
    """Grader output kept per rollout (the tail beyond this is cut, and says so)."""
    suspect_policy: Literal["zero", "keep"] = "zero"
    """What a patch labelled ``suspect_patch`` scores (the code it added is built to fool comparisons: an
    ``__eq__`` returning a constant, a redefined assertion helper; docs/grading.md): ``zero`` = reward 0,
    ``keep`` = the tests' verdict stands. Either way the rollout ends ``suspect_patch`` and is counted."""


class RolloutConfig(Section):
    prompt_data: str | None = None
    """Task rows (JSONL), default $DATA_ROOT/train.jsonl."""
    input_key: str = "prompt"
    """Row key of the prompt messages."""
    label_key: str = "label"
    """Row key of the label (the task's instance id)."""
    metadata_key: str = "metadata"
    """Row key of the task metadata (image, workdir, eval_cmd, ...)."""
    batch_size: int = Field(default=2, ge=1)
    """Prompts per rollout step."""
    samples_per_prompt: int = Field(default=2, ge=1)
    """Agent runs per prompt (the GRPO group size)."""
    temperature: float = 1.0
    """Sampling temperature (>= 0; 0 = greedy)."""
    top_p: float = 0.95
    """Nucleus probability in (0, 1]."""
    top_k: int = -1
    """Top-k truncation; -1 disables it."""
    guard_s: float | None = None
    """Whole-rollout deadline including sandbox setup and grading (default agent + grader + slack)."""
    guard_slack_s: float = Field(default=300.0, ge=0)
    """Slack added to agent budget + grader timeout to form the default guard."""
    fork_merge_max_response_tokens: int = Field(default=0, ge=0)
    """Short-turn rewrite merging threshold; 0 keeps every captured generated turn."""
    capture_nucleus: bool = False
    """Keep each sampled token's top-p nucleus ids and sampler probabilities (needed by score centering)."""
    use_rollout_routing_replay: bool = False
    """R3: record MoE expert routes at rollout and replay them in training (MoE models only)."""
    max_staleness: int = Field(default=1, ge=0)
    """Policies (trained steps) a rollout may lag behind the step that trains it: a rollout started while the
    engines served step p's policy is trained at step s only if s - p <= max_staleness. 0 = synchronous (no
    rollout runs while the trainer trains); 1 (default) overlaps each step's rollouts with the previous
    step's training. Work past the bound is not started, or cancelled (see partial_rollouts)."""
    sync_in_flight: Literal["wait", "keep"] = "wait"
    """What a weight sync does to generation requests in flight: wait = they finish on the old weights before
    the swap (the sync waits for the longest one, bounded by max_response_tokens); keep = they are frozen and
    continue on the new weights (a turn may then span two versions, each token tagged with its own)."""
    partial_rollouts: Literal["off", "keep", "drop"] = "off"
    """Rollouts in flight across a weight update. off: a rollout is as old as the policy it started on, and
    one past rollout.max_staleness is cancelled. keep / drop: it is never cancelled for its age; it runs on
    (its later turns sample from the new weights) and is trained with each token's own weight version: keep
    trains its tokens older than max_staleness too, each corrected by its own sampling log-prob
    (train.is_correction), drop masks them out of the loss (its reward still counts in its group)."""
    concurrency: int = Field(default=8, ge=1)
    """Rollouts in flight at once during a training step (sandboxes and CLIs for coding tasks, engine
    requests for an environment); the engine batches what arrives."""


class TrainConfig(Section):
    backend: Literal["torch", "megatron"] = "torch"
    """Trainer: torch in-process (one machine) or Megatron-core workers placed by Ray."""
    algorithm: Literal["grpo", "gspo"] = "grpo"
    """Policy loss: token-level GRPO or sequence-level GSPO."""
    num_rollout: int = Field(default=1, ge=1)
    """Rollout steps (each followed by one policy update)."""
    global_batch_size: int | None = Field(default=None, ge=1)
    """Samples per optimizer step (default rollout batch × samples per prompt)."""
    micro_batch_tokens: int = Field(default=16384, ge=1)
    """Token budget of one micro-batch."""
    precision: Literal["bf16", "fp32"] = "bf16"
    """The trainer forward's compute on CUDA: bf16 autocast over fp32 master weights, or fp32 throughout (parity
    checks; several times slower). Both backends; CPU always computes in fp32."""
    packed_attention: Literal["auto", "varlen", "sdpa"] = "auto"
    """Torch backend: how a packed micro-batch's segments are kept apart. varlen = flash attention over each
    segment (CUDA and bf16 only), sdpa = a block-diagonal mask (cost T²), auto = varlen where it runs, else sdpa."""
    true_on_policy: bool = False
    """Rollout and trainer logprobs bit-identical (max |Δ| = 0 in the consistency figures): the embedded engine and
    the torch trainer run every matmul, RMSNorm, attention and log-softmax through the same batch-invariant
    kernels (`serving.batch_invariant`), eagerly. Needs serving.backend = "embedded", train.backend = "torch", one
    trainer process, a dense Llama-family model, rollout.top_p = 1 and top_k = -1, train.precision = "bf16" on
    CUDA; slower than the default (docs/training.md, "True on-policy")."""
    tensor_parallel: int = Field(default=1, ge=1)
    """Megatron tensor-parallel size (train.backend = "megatron"; must divide the model's KV heads and FFN)."""
    pipeline_parallel: int = Field(default=1, ge=1)
    """Megatron pipeline-parallel size: stages of num_hidden_layers / PP consecutive layers (must divide it)."""
    data_parallel: int | None = Field(default=None, ge=1)
    """Data-parallel size (default trainer GPUs / (TP × PP)); TP × PP × DP = trainer processes."""
    expert_parallel: int = Field(default=1, ge=1)
    """Megatron expert-parallel size for a mixture-of-experts model: each of EP data-parallel ranks holds
    num_experts / EP of every layer's experts (megatron-core's layout, carved out of DP: EP must divide DP and
    the expert count; TP = 1). Adds no processes."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (TP > 1, one pipeline stage): activations outside the tensor-parallel
    regions are split along the sequence over the TP ranks (less activation memory per GPU); a
    mixture-of-experts model needs it to train under TP."""
    lr: float = Field(default=1e-6, gt=0)
    """Learning rate."""
    warmup_steps: int = Field(default=0, ge=0)
    """Optimizer steps of linear learning-rate warm-up (lr/warmup_steps, 2·lr/warmup_steps, ... lr); 0 = none.
    Constant after it."""
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient 2-norm to this before each optimizer step; null = no clipping."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay, on weight matrices only (not norms or biases). Non-zero decay changes
    the parameters even on a step whose advantages are all zero."""
    gradient_checkpointing: bool | None = None
    """Recompute activations during the backward pass: one layer's activations held instead of all of them.
    Unset (the default) = on, except the Megatron backend off CUDA (megatron-core recomputes only there). A
    segment is never split, so one rollout of model.max_context_tokens is one micro-batch, and without it a
    64k-token segment of a 0.6B Qwen3 does not fit an H200's 140 GiB (20 GiB with it; ~1.2× step time on
    shorter batches: benchmarks/RESULTS.md)."""
    dual_clip_c: float | None = Field(default=None, gt=1)
    """Dual clip: a negative-advantage token's loss is at most ``c·|A|`` (e.g. 3); null disables it."""
    is_correction: Literal["none", "tis", "mis"] = "tis"
    """Rollout-vs-trainer importance correction: truncated (tis) or masked (mis) importance sampling. The
    default is tis because training is asynchronous by default (rollout.max_staleness = 1): tokens sampled by
    an older policy need the correction, and on-policy tokens get a ratio of ~1 (a no-op)."""
    is_level: Literal["token", "sequence"] = "token"
    """The importance ratio per token, or one per rollout (the product over its trained tokens)."""
    is_low: float = Field(default=0.0, ge=0)
    """Lower threshold of the importance ratio: tis clamps to it, mis masks below it (0 = no lower bound)."""
    is_high: float = Field(default=2.0, gt=0)
    """Upper threshold of the importance ratio: tis clamps to it, mis masks above it."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Coefficient of the k3 KL to the frozen initial policy (0: no reference model is kept)."""
    clip_low: float = Field(default=0.2, ge=0)
    """Lower ratio clip ε."""
    clip_high: float = Field(default=0.28, ge=0)
    """Upper ratio clip ε."""
    use_score_centering: bool = False
    """Score-centering REINFORCE objective; needs rollout.capture_nucleus."""
    loss_agg: Literal["rollout", "token"] = "rollout"
    """How token losses add up: rollout = the mean over rollouts of each rollout's token mean; token = every
    trained token of the step weighs the same (DAPO's token mean), so tokens a group's rollouts share cancel
    exactly instead of a short failure's prefix outweighing a long success's. grpo only."""
    infra_failure_policy: InfraFailurePolicy = "exclude"
    """What infrastructure-failed rollouts do: excluded from statistics and loss, or kept with reward 0."""
    control: Literal["none", "zero_advantage"] = "none"
    """`zero_advantage`: the control arm of an experiment. The loss sees every advantage as 0; everything else
    is the training run's (rollouts, rewards, which steps take an optimizer step, the KL term, weight decay,
    the weight sync), so a rise the control lacks is the policy gradient's doing. Each metrics row then has
    `control_zero_advantage` = 1 and a `control_arm` event marks each launch."""
    resume: bool = False
    """Continue the run already in paths.run_root instead of refusing to touch it."""
    resume_override: list[str] = Field(default_factory=list)
    """Keys a resume may change from the run's newest launch (`lego train --resume --override KEY`). A resume
    that changes a key shaping training (config/resume_keys.py lists them: loss, optimizer, model, data,
    environment, sampling, reward) is refused unless it is named here; named, the new value takes effect
    (the optimizer's restored learning rate included) and a `resume_override` event marks the step."""
    audit: bool = False
    """Record the chain for `lego audit`: every trainer rank's steps (audit/rank-<r>.jsonl: tokens and logprobs as
    the loss reads them, optimizer steps, parameter fingerprints) and the embedded engine's served tokens
    (audit/engine-0.jsonl); `lego serve --served-log` writes the same for separate engines."""
    environment: str | None = None
    """A verifiable environment registered in the `lego_rl.environments` entry-point group (e.g. the
    built-in `first_letter`): rollouts sample from the engine and score the text themselves, with no
    sandbox or CLI. Unset = coding-agent rollouts through the harnesses."""
    environment_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the environment's constructor (JSON object)."""
    eval_data: str | None = None
    """Held-out rows (JSONL, same shape as rollout.prompt_data) for evaluation every `eval_every` steps."""
    eval_every: int = Field(default=0, ge=0)
    """Evaluate pass@1 on eval_data after every N-th step (and after the last); 0 = never."""
    eval_samples: int = Field(default=4, ge=1)
    """Rollouts per held-out row; pass@1 is their mean solve rate, averaged over rows."""
    checkpoint_every: int = Field(default=0, ge=0)
    """Save a trainer checkpoint (weights, optimizer, data cursor) after every N-th step; 0 = only at the
    end and when stopped. Resume continues from the newest one."""
    max_refills: int = Field(default=2, ge=0)
    """New rollouts for the same prompt when one fails for an infrastructure reason that admission
    excludes, per sample slot; past it the failure is excluded and the group trains on the rest."""
    oversample_zero_variance: bool = False
    """Replace a group whose rewards are all equal (zero advantage, no signal) by a freshly drawn prompt,
    up to rollout.batch_size extra prompts per step; off = such groups stay in with zero advantage."""
    retire_zero_variance_after: int = Field(default=0, ge=0)
    """Retire a task (never draw it again) after this many zero-variance groups of it in a row: it stopped
    carrying signal, usually because the policy always solves it. 0 = never retire (the counts are still in
    each step's metrics row and in `lego monitor`). The last task still drawn is never retired."""
    seed: int = 0
    """Seed of the prompt order (reshuffled every epoch over the dataset)."""
    sft_data: str | None = None
    """Demonstrations for supervised fine-tuning (Samples as JSON lines, e.g. rollouts' samples.jsonl; see
    docs/training.md). When set, `lego train` runs SFT on them (cross-entropy on the loss-masked tokens) with
    the same trainer backend instead of GRPO; its checkpoints are model directories a later run can start from."""
    sft_steps: int = Field(default=20, ge=1)
    """SFT optimizer steps (the demonstrations repeat in a reshuffled order every epoch)."""
    sft_batch_size: int = Field(default=4, ge=1)
    """Demonstrations (whole rollouts, every segment) per SFT optimizer step."""


RayPlacement = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
"""A Ray placement group strategy: PACK fills a node before the next, STRICT_SPREAD puts every bundle on a
different node (docs/cluster.md)."""


class ClusterConfig(Section):
    mode: Literal["local", "ray"] = "local"
    """local: `lego train` runs the trainer and the engine in its own process (or under torchrun). ray: it places
    the trainer ranks and the engine replicas as Ray actors on a Ray cluster (docs/cluster.md)."""
    trainer_nodes: int = Field(default=1, ge=1)
    """Nodes running the trainer."""
    gpus_per_node: int = Field(default=0, ge=0)
    """GPUs per trainer node (0 = CPU; with cluster.mode = "ray" a CPU node runs one trainer rank)."""
    engine_replicas: int = Field(default=1, ge=1)
    """Ray mode: embedded-engine replicas, each a Ray actor serving vLLM-shaped HTTP routes."""
    gpus_per_engine: int = Field(default=0, ge=0, le=1)
    """Ray mode: GPUs of each engine replica (0 = CPU; the embedded engine uses one device)."""
    cpus_per_actor: float = Field(default=1.0, gt=0)
    """Ray mode: logical CPUs each trainer rank and each engine replica reserves in its placement bundle."""
    trainer_placement: RayPlacement = "PACK"
    """Ray mode: placement group strategy of the trainer ranks (one bundle per rank)."""
    engine_placement: RayPlacement = "PACK"
    """Ray mode: placement group strategy of the engine replicas (one bundle per replica)."""
    trainer_resources: dict[str, float] = Field(default_factory=dict)
    """Ray mode: custom resources every trainer bundle also needs (e.g. {"train_node": 1} to keep the ranks on
    nodes started with `ray start --resources '{"train_node": 8}'`)."""
    engine_resources: dict[str, float] = Field(default_factory=dict)
    """Ray mode: custom resources every engine bundle also needs."""
    train_head: str | None = None
    """Ray mode: the first training node (TRAIN_HEAD), its address on the training network or an SSH client
    config alias whose HostName is. With cluster.start_ray (and no cluster.ray_address), `lego train` starts the
    Ray head there (over SSH unless it is this machine) and stops it at the end."""
    train_workers: list[str] = Field(default_factory=list)
    """Ray mode with cluster.start_ray and cluster.train_head: the other training nodes (TRAIN_WORKER), where
    `lego train` starts a Ray worker over SSH."""
    ssh_port: int = Field(default=22, ge=1, le=65535)
    """SSH port of the training nodes and the sandbox nodes (a cluster.json node without `port` uses it)."""
    ssh_config: str | None = None
    """SSH client config file for the training nodes and the sandbox nodes of cluster.json (identity, pinned
    host keys, proxy), used to start Ray (cluster.start_ray), by the sunabako provider, `lego validate --remote`
    and `lego sandbox gc`; unset = the user's own."""
    gloo_socket_ifname: str | None = None
    """Network interface for Gloo/NCCL bootstrap."""
    start_ray: bool = True
    """Ray mode without cluster.ray_address: start Ray for the run and stop it at the end, on
    cluster.train_head and cluster.train_workers (over SSH) or, without a head, as a one-node head in the
    `lego train` process (false = join the running cluster that `ray start` made on this node, or
    $RAY_ADDRESS)."""
    ray_address: str | None = None
    """Ray mode: the address of the Ray cluster to join (`ray start --head` prints it, e.g. 10.0.0.1:6379)."""


class MonitorConfig(Section):
    refresh_s: float = Field(default=2.0, gt=0)
    """Refresh period of `lego monitor`."""
    kl_warn: float = Field(default=1e-3, gt=0)
    """Rollout-vs-trainer KL above which the consistency view warns."""


class LogConfig(Section):
    """Where the metrics rows are mirrored besides ``metrics.jsonl`` (the record): TensorBoard and W&B, both
    through the metric declarations (docs/training.md, "Metrics sinks")."""

    tensorboard: bool = True
    """Write TensorBoard scalars of every metrics row into RUN_ROOT/tensorboard (needs the `train` extra)."""
    wandb: bool = False
    """Also log every metrics row to Weights & Biases (needs the `wandb` extra; online mode needs
    `wandb login` or WANDB_API_KEY)."""
    wandb_project: str = "lego-rl"
    """W&B project of the runs."""
    wandb_entity: str | None = None
    """W&B entity (user or team); default: the logged-in user's."""
    wandb_name: str | None = None
    """W&B run name; default the run directory's name (a resume logs a new W&B run `<name>-resume<k>`)."""
    wandb_group: str | None = None
    """W&B group that holds every launch of this run directory; default the run directory's name."""
    wandb_tags: list[str] = Field(default_factory=list)
    """W&B tags of the run."""
    heartbeat_s: float = Field(default=30.0, gt=0)
    """When stderr is no terminal (a log file, a pipe), `lego train` prints its status line with the counts of
    the moment at least this often (seconds), besides a line per phase and a summary per step."""
    wandb_mode: Literal["online", "offline"] = "online"
    """`offline` writes RUN_ROOT/wandb/offline-run-*/ without a network (upload later with `wandb sync`)."""


class PathsConfig(Section):
    data_root: str = ".lego/data"
    """Shared data directory (datasets, cluster.json, images.json, toolchain)."""
    run_root: str | None = None
    """This run's directory; default runs/run-<timestamp>. Use a new one per experiment."""
    artifacts: str | None = None
    """Saved CLI trajectories, sandbox commands and grader output (default $RUN_ROOT/sandboxes)."""
    run_log: str | None = None
    """Append-only event log (default $RUN_ROOT/events.jsonl); never overwritten."""
    toolchain_dir: str | None = None
    """Pinned CLI tarballs from `lego toolchain fetch` (default $DATA_ROOT/toolchain)."""


class LegoConfig(BaseModel):
    """The whole resolved configuration."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(default_factory=ModelConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)
    adapter: AdapterConfig = Field(default_factory=AdapterConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    grader: GraderConfig = Field(default_factory=GraderConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    paths: PathsConfig = Field(default_factory=PathsConfig)
    harness: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """`[harness.<name>]` tables as given (file < environment < --set), key by key. The config knows no
    harness plugin: each table is validated by its plugin's own options model where harnesses are loaded
    (``lego validate``, the rollout), and an unknown harness name is a ``lego validate`` finding."""


HARNESS = "harness"
"""The table of per-harness tables; not a ``Section``: its keys are the plugins' to define."""

SECTIONS: dict[str, type[Section]] = {
    name: info.annotation  # type: ignore[misc]
    for name, info in LegoConfig.model_fields.items()
    if name != HARNESS
}
