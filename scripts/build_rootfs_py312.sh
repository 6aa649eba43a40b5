#!/usr/bin/env bash
# Build (once) a root filesystem with Python 3.12 for harnesses that need it inside the sandbox (the
# OpenHands SDK needs Python >= 3.12; Debian bookworm has 3.11 and trixie 3.13, so this is Ubuntu noble).
#
#   scripts/build_rootfs_py312.sh      # -> ${LEGO_ROOTFS_PY312_CACHE:-/var/cache/lego-rl/rootfs-noble-py312}
#
# Packages: python3 (3.12, full stdlib), git, patch, tmux (the OpenHands terminal tool runs in tmux),
# ca-certificates. Idempotent and cached like scripts/build_rootfs.sh: a stamp names the package set, the
# build goes to a sibling temp dir renamed into place only when complete. Needs root, debootstrap and the
# Ubuntu archive (about 2 min, ~280 MB). The rollout tests point the example image at this tree for the
# openhands harness only.
set -euo pipefail

DEST="${LEGO_ROOTFS_PY312_CACHE:-/var/cache/lego-rl/rootfs-noble-py312}"
MIRROR="${LEGO_ROOTFS_PY312_MIRROR:-http://archive.ubuntu.com/ubuntu}"
SUITE=noble
PACKAGES="python3,git,patch,tmux,ca-certificates"
STAMP_NAME=".lego-rootfs-stamp"
STAMP="suite=${SUITE} packages=${PACKAGES} version=1"

if [[ -f "${DEST}/${STAMP_NAME}" ]] && [[ "$(cat "${DEST}/${STAMP_NAME}")" == "${STAMP}" ]]; then
    echo "rootfs up to date: ${DEST}"
    exit 0
fi
[[ "$(id -u)" == 0 ]] || { echo "build_rootfs_py312.sh: must run as root (debootstrap)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "build_rootfs_py312.sh: apt-get install debootstrap" >&2; exit 2; }
# Debian's debootstrap may predate noble; every Ubuntu suite uses the same (gutsy) script.
script="/usr/share/debootstrap/scripts/${SUITE}"
[[ -e "${script}" ]] || script="/usr/share/debootstrap/scripts/gutsy"

parent="$(dirname "${DEST}")"
mkdir -p "${parent}"
chmod 0755 "${parent}"
tmp="$(mktemp -d "${DEST}.tmp.XXXXXX")"
trap 'rm -rf --one-file-system "${tmp}"' EXIT
chmod 0755 "${tmp}"

debootstrap --variant=minbase --include="${PACKAGES}" "${SUITE}" "${tmp}" "${MIRROR}" "${script}"

rm -rf "${tmp}"/var/cache/apt/archives/*.deb "${tmp}"/var/lib/apt/lists/* \
       "${tmp}"/usr/share/doc/* "${tmp}"/usr/share/man/* "${tmp}"/usr/share/info/*
find "${tmp}/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
chroot "${tmp}" python3.12 -c 'import unittest'  # the graders' test runner
mkdir -p "${tmp}/testbed" "${tmp}/workspace"
chmod 1777 "${tmp}/tmp"
printf '%s' "${STAMP}" > "${tmp}/${STAMP_NAME}"

# A stale tree is moved aside and kept until nothing mounts it (sandboxes may still run over it).
if [[ -e "${DEST}" ]]; then
    mv "${DEST}" "$(mktemp -u "${DEST}.old.XXXXXX")"
fi
mv "${tmp}" "${DEST}"
trap - EXIT
echo "rootfs built: ${DEST} ($(du -sh "${DEST}" | cut -f1))"
