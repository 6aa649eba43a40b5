# Two entry points for a fresh machine (see README): `make run` and `make test`.
# Everything else here is a step they call; each step is idempotent and cheap when already done.

PY        ?= python3.11
VENV      ?= .venv
LEGO      := $(VENV)/bin/lego
PYTEST    := $(VENV)/bin/pytest
STAMP     := $(VENV)/.lego-setup-stamp
PYTEST_ARGS ?=
# The suite runs in parallel workers: most of its time is spent waiting on sandboxes, CLIs and subprocesses,
# so a 2-core machine keeps more workers than cores busy (tests/conftest.py gives each one OpenMP thread).
TEST_WORKERS ?= 3

.PHONY: run test setup system-deps test-deps clean-runs

run: setup ## set up, then run the main job on the embedded defaults (lego.toml)
	scripts/build_rootfs.sh
	$(LEGO) toolchain fetch --harness claude_code --dir .lego/toolchain
	$(LEGO) validate -c lego.toml
	LEGO=$(LEGO) scripts/run_main_job.sh

test: setup test-deps ## set up everything the suite needs, then run all tests (what CI runs)
	state="$$(scripts/mount_test_state.sh)" && \
	LEGO_SUNABAKO_TEST_STATE="$$state/test" LEGO_SUNABAKO_ROLLOUT_STATE="$$state/rollout" \
	$(PYTEST) -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 $(PYTEST_ARGS)

setup: system-deps $(STAMP)

# System packages: bubblewrap (local sandboxes), debootstrap/skopeo/umoci (root filesystems and image import),
# iproute2 (loopback-only network namespaces for CLI and Ray tests; the agent sandbox's egress relay), acl
# (setfacl: task images whose files carry ACLs, in the workspace tests), tmux (the `lego monitor` TUI tests drive
# it in a real terminal), chromium-headless-shell (the `lego report` test screenshots the HTML), xfsprogs (mkfs.xfs: the sunabako
# reflink-staging test builds a real XFS filesystem on a loop device), jq (the skills' command blocks read --json
# output with it, and their tests run every block), openssh-server (sshd: the sandbox-node tests run a second host,
# an sshd in its own network namespace; the client, ssh, comes with it), e2fsprogs (mkfs.ext4: bwrap's
# sandbox.disk_mb layer; Debian usually has it, slim images may not).
system-deps:
	@missing=""; for bin in bwrap debootstrap skopeo umoci ip setfacl tmux chromium-headless-shell mkfs.xfs mkfs.ext4 jq sshd ssh; do command -v $$bin >/dev/null || missing="$$missing $$bin"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages for:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap debootstrap skopeo umoci iproute2 acl tmux chromium-headless-shell xfsprogs e2fsprogs jq openssh-server >/dev/null; \
	fi

$(STAMP): pyproject.toml $(wildcard plugins/*/pyproject.toml)
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# plots: matplotlib, for the main job's pass@1 plot (scripts/main_job_report.py) and benchmarks/plot_curves.py.
	# torch 2.13.0 first: pip takes the CPU build from this machine's wheel cache instead of a CUDA download.
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[serve,train,sunabako,wandb,dev,plots]'
	LEGO_PYTHON=$(VENV)/bin/python scripts/install_plugins.sh
	touch $(STAMP)

# Real components the suite runs against: vLLM (CPU build, own venv), the coding CLIs from npm/PyPI,
# and two debootstrap root filesystems for sandbox tests: bookworm, and trixie for OpenHands (Python 3.13;
# its interpreter also builds the OpenHands site trees, so it comes before the CLIs and the toolchain).
# Each script caches its result. megatron-core (the `megatron` extra, 0.16.1: the newest for Python 3.11, one
# binary wheel, installs in seconds, no Transformer Engine or Apex) runs the Megatron backend's CPU tests; Ray
# (the `cluster` extra, 7 s) runs cluster mode's two-node test (tests/cluster).
test-deps: setup
	$(VENV)/bin/pip install -q 'megatron-core==0.16.1'
	$(VENV)/bin/pip install -q 'ray==2.60.0'
	scripts/setup_vllm.sh
	scripts/build_rootfs.sh
	scripts/build_rootfs_trixie.sh
	scripts/setup_clis.sh
	scripts/setup_tasks.sh
	LEGO=$(LEGO) scripts/setup_toolchain.sh

clean-runs:
	rm -rf runs/
