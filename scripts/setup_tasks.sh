#!/usr/bin/env bash
# One-time set-up for the task/image/grader tests (tests/tasks, tests/images, tests/swe):
# skopeo + umoci (OCI image import), bubblewrap (the bwrap provider), git + patch (workspace, grader),
# and the shared debootstrap rootfs (scripts/build_rootfs.sh, cached). Idempotent: installs only what
# is missing, and build_rootfs.sh is a no-op when its stamp matches.
set -euo pipefail

need=()
for tool in skopeo umoci bwrap git patch; do
    command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
if ((${#need[@]})); then
    pkgs=()
    for tool in "${need[@]}"; do
        case "$tool" in bwrap) pkgs+=(bubblewrap) ;; *) pkgs+=("$tool") ;; esac
    done
    if [[ "$(id -u)" != 0 ]]; then
        echo "setup_tasks.sh: missing ${pkgs[*]}; run as root (apt-get install)" >&2
        exit 2
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}"
fi
exec "$(dirname "$0")/build_rootfs.sh"
