#!/usr/bin/env bash
# Build (once) the Debian trixie root filesystem for harnesses that need a newer Python inside the sandbox:
# the OpenHands SDK needs Python >= 3.12, bookworm has 3.11, trixie has 3.13 (from the Debian archive, like
# every other system package here; no Ubuntu or python.org download).
#
#   scripts/build_rootfs_trixie.sh     # -> ${LEGO_ROOTFS_TRIXIE_CACHE:-/var/cache/lego-rl/rootfs-trixie}
#
# The openhands harness defaults to this tree's python3.13. Its Python also serves the host
# (scripts/trixie_python.sh): the OpenHands site trees are pip-installed by this interpreter, so the host
# needs no Python 3.13. Packages: python3 (full stdlib: graders run unittest/pytest), python3-pip (builds
# those site trees; `pip install --target` only), git, patch, tmux (the OpenHands terminal tool runs in
# tmux), ca-certificates. Idempotent and cached like scripts/build_rootfs.sh: a stamp names the package
# set, the build goes to a sibling temp dir renamed into place only when complete. Needs root,
# debootstrap >= 1.0.128 (knows trixie) and a Debian mirror (about 3 min, ~250 MB).
set -euo pipefail

DEST="${LEGO_ROOTFS_TRIXIE_CACHE:-/var/cache/lego-rl/rootfs-trixie}"
MIRROR="${LEGO_ROOTFS_MIRROR:-http://deb.debian.org/debian}"
SUITE=trixie
PYTHON=python3.13
PACKAGES="python3,python3-pip,git,patch,tmux,ca-certificates"
STAMP_NAME=".lego-rootfs-stamp"
STAMP="suite=${SUITE} packages=${PACKAGES} version=1"

if [[ -f "${DEST}/${STAMP_NAME}" ]] && [[ "$(cat "${DEST}/${STAMP_NAME}")" == "${STAMP}" ]]; then
    echo "rootfs up to date: ${DEST}"
    exit 0
fi
[[ "$(id -u)" == 0 ]] || { echo "build_rootfs_trixie.sh: must run as root (debootstrap)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "build_rootfs_trixie.sh: apt-get install debootstrap" >&2; exit 2; }
[[ -e "/usr/share/debootstrap/scripts/${SUITE}" ]] || {
    echo "build_rootfs_trixie.sh: this debootstrap does not know ${SUITE}; upgrade it (bookworm's 1.0.128 does)" >&2
    exit 2
}

parent="$(dirname "${DEST}")"
mkdir -p "${parent}"
# sunabako chroots into copies of this tree: no directory above it may be root-only (0700).
chmod 0755 "${parent}"
tmp="$(mktemp -d "${DEST}.tmp.XXXXXX")"
trap 'rm -rf --one-file-system "${tmp}"' EXIT
chmod 0755 "${tmp}"

debootstrap --variant=minbase --include="${PACKAGES}" "${SUITE}" "${tmp}" "${MIRROR}"

rm -rf "${tmp}"/var/cache/apt/archives/*.deb "${tmp}"/var/lib/apt/lists/* \
       "${tmp}"/usr/share/doc/* "${tmp}"/usr/share/man/* "${tmp}"/usr/share/info/*
# Translations are a large share of the tree, and sunabako copies the whole rootfs on every create.
find "${tmp}/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
chroot "${tmp}" "${PYTHON}" -c 'import unittest, sqlite3, ssl'  # graders' runner; the SDK's stdlib needs
chroot "${tmp}" "${PYTHON}" -m pip --version >/dev/null
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
