#!/usr/bin/env bash
# Give the suite's sunabako nodes a folder on XFS with reflinks, and print it: the Makefile's test target puts
# LEGO_SUNABAKO_TEST_STATE and LEGO_SUNABAKO_ROLLOUT_STATE below it (tests/conftest.py adds the xdist worker).
#
#   scripts/mount_test_state.sh        # -> prints /var/lib/lego-rl/sunabako-test-xfs/state
#
# Why: every sunabako create copies its image's root filesystem with `cp -a --reflink=auto`. On ext4 that is a
# full copy (100-500 MB, seconds to a minute on a loaded 2-core machine), once per sandbox; on XFS with reflinks
# each image is staged once and every create is a clone (lego_rl.sandbox.sunabako_stage). The suite opens
# hundreds of sunabako sandboxes.
#
# The filesystem lives in a sparse file mounted with `discard`, so the host disk holds only what is in use.
# Idempotent: an existing mount is reused. Where a loop mount is impossible (no root, no loop devices, no
# mkfs.xfs) it prints the plain default state dir and says why on stderr; the suite then runs as before.
set -euo pipefail

BASE="${LEGO_TEST_XFS_DIR:-/var/lib/lego-rl/sunabako-test-xfs}"
IMAGE="${BASE}.img"
SIZE="${LEGO_TEST_XFS_SIZE:-32G}"
FALLBACK="/var/lib/lego-rl/sunabako-plain"

fallback() {
    echo "mount_test_state.sh: $1; the sunabako tests copy root filesystems in full (slower)" >&2
    mkdir -p "${FALLBACK}" && chmod 755 "$(dirname "${FALLBACK}")" "${FALLBACK}"
    echo "${FALLBACK}"
    exit 0
}

if mountpoint -q "${BASE}" 2>/dev/null; then
    mkdir -p "${BASE}/state"
    echo "${BASE}/state"
    exit 0
fi
[[ "$(id -u)" == 0 ]] || fallback "not root"
command -v mkfs.xfs >/dev/null || fallback "mkfs.xfs is not installed (apt-get install xfsprogs)"
mkdir -p "${BASE}"
chmod 755 "${BASE}" "$(dirname "${BASE}")"  # sandbox guest uids traverse it to reach their root filesystems
if [[ ! -f "${IMAGE}" ]]; then
    truncate -s "${SIZE}" "${IMAGE}.tmp"
    mkfs.xfs -q -m reflink=1 "${IMAGE}.tmp" >&2 || { rm -f "${IMAGE}.tmp"; fallback "mkfs.xfs failed"; }
    mv "${IMAGE}.tmp" "${IMAGE}"  # only a finished filesystem gets the final name
fi
mount -o loop,discard "${IMAGE}" "${BASE}" >&2 || fallback "cannot loop-mount ${IMAGE}"
chmod 755 "${BASE}"
mkdir -p "${BASE}/state"
echo "${BASE}/state"
