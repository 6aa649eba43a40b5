#!/usr/bin/env bash
# Build (once) the small Debian root filesystem that sandbox tests boot: bwrap and sunabako.
#
#   scripts/build_rootfs.sh            # -> ${LEGO_ROOTFS_CACHE:-/var/cache/lego-rl/rootfs-bookworm}
#   LEGO_ROOTFS_CACHE=/some/dir scripts/build_rootfs.sh
#
# Idempotent and cached: a finished rootfs carries a stamp naming its package set; a matching stamp
# means nothing to do. The build goes to a sibling temp dir that is renamed into place only when
# complete, so an interrupted build never leaves a rootfs that looks finished.
# Needs root, debootstrap and a reachable Debian mirror (about 30 s, ~130 MB). `python3` (not only
# python3-minimal) because task graders run `python3 -m unittest` / pytest, which need the full stdlib.
set -euo pipefail

DEST="${LEGO_ROOTFS_CACHE:-/var/cache/lego-rl/rootfs-bookworm}"
SUITE="${LEGO_ROOTFS_SUITE:-bookworm}"
MIRROR="${LEGO_ROOTFS_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3-minimal,python3,git,patch,ca-certificates"
STAMP_NAME=".lego-rootfs-stamp"
STAMP="suite=${SUITE} packages=${PACKAGES} version=1"

if [[ -f "${DEST}/${STAMP_NAME}" ]] && [[ "$(cat "${DEST}/${STAMP_NAME}")" == "${STAMP}" ]]; then
    echo "rootfs up to date: ${DEST}"
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "build_rootfs.sh: must run as root (debootstrap)" >&2
    exit 2
fi
command -v debootstrap >/dev/null || { echo "build_rootfs.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 2; }

parent="$(dirname "${DEST}")"
mkdir -p "${parent}"
# sunabako chroots into copies of this tree: no directory above it may be root-only (0700).
chmod 0755 "${parent}"
tmp="$(mktemp -d "${DEST}.tmp.XXXXXX")"
trap 'rm -rf --one-file-system "${tmp}"' EXIT
chmod 0755 "${tmp}"

debootstrap --variant=minbase --include="${PACKAGES}" "${SUITE}" "${tmp}" "${MIRROR}"

# Trim what a sandbox never needs: package caches, docs, man pages, locales other than C.
rm -rf "${tmp}"/var/cache/apt/archives/*.deb "${tmp}"/var/lib/apt/lists/* \
       "${tmp}"/usr/share/doc/* "${tmp}"/usr/share/man/* "${tmp}"/usr/share/info/*
# Translations are 40% of the tree, and sunabako copies the whole rootfs on every create.
find "${tmp}/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
mkdir -p "${tmp}/testbed" "${tmp}/workspace"
chmod 1777 "${tmp}/tmp"
printf '%s' "${STAMP}" > "${tmp}/${STAMP_NAME}"

# Swap atomically: a previous (stale) rootfs is moved aside first, then removed.
if [[ -e "${DEST}" ]]; then
    old="$(mktemp -d "${DEST}.old.XXXXXX")"
    mv "${DEST}" "${old}/rootfs"
    mv "${tmp}" "${DEST}"
    rm -rf --one-file-system "${old}"
else
    mv "${tmp}" "${DEST}"
fi
trap - EXIT
echo "rootfs built: ${DEST} ($(du -sh "${DEST}" | cut -f1))"
