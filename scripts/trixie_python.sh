#!/usr/bin/env bash
# Run the python3.13 of the Debian trixie rootfs (scripts/build_rootfs_trixie.sh) on the host, in a
# bubblewrap mount namespace. It builds the OpenHands site trees (its pip comes from Debian) and runs the
# OpenHands SDK for the end-to-end tests, so the host needs no Python 3.13 (Debian bookworm has 3.11):
#
#   scripts/trixie_python.sh [--ro PATH]... [--] PYTHON-ARGS...
#   lego toolchain fetch --python scripts/trixie_python.sh
#
# The rootfs's /usr and /etc are mounted read-only: sandboxes use the same tree as their lower layer, so
# nothing may write into it. Shared with the host: the network with its DNS settings and CA certificates,
# /tmp, the current directory (read-write), each --ro PATH and a script named as the first argument
# (read-only), and the host's pip cache. Nothing else of the host is visible. Needs bwrap and the rootfs
# (${LEGO_ROOTFS_TRIXIE_CACHE:-/var/cache/lego-rl/rootfs-trixie}).
set -euo pipefail

ROOTFS="${LEGO_ROOTFS_TRIXIE_CACHE:-/var/cache/lego-rl/rootfs-trixie}"
PYTHON=/usr/bin/python3.13

[[ -f "${ROOTFS}/.lego-rootfs-stamp" ]] || {
    echo "trixie_python.sh: no trixie rootfs at ${ROOTFS}: run scripts/build_rootfs_trixie.sh" >&2
    exit 2
}
command -v bwrap >/dev/null || { echo "trixie_python.sh: apt-get install bubblewrap" >&2; exit 2; }

shared=()  # "rw:PATH" / "ro:PATH", mounted shortest path first so a nested share lands on top
while (($#)); do
    case "$1" in
        --ro) [[ -e "${2:-}" ]] || { echo "trixie_python.sh: --ro ${2:-}: no such path" >&2; exit 2; }
              shared+=("ro:$(realpath "$2")"); shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
if [[ -n "${1:-}" && "$1" != -* && -f "$1" ]]; then
    shared+=("ro:$(realpath "$1")")
fi
cwd="$(pwd -P)"
case "${cwd}" in
    /|/tmp|/tmp/*) ;;  # / is the rootfs; /tmp is shared whole
    *) shared+=("rw:${cwd}") ;;
esac
for cert in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" "${REQUESTS_CA_BUNDLE:-}"; do
    case "${cert}" in ""|/etc/*|/usr/*) ;; *) [[ -f "${cert}" ]] && shared+=("ro:$(realpath "${cert}")") ;; esac
done
cache="${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/pip"
[[ -d "${cache}" ]] && shared+=("rw:$(realpath "${cache}")")

# The host's network settings come along: DNS, and its CA bundle (a TLS-inspecting proxy's certificate
# is trusted there, not in the fresh rootfs).
bundle=/etc/ssl/certs/ca-certificates.crt
args=(--ro-bind "${ROOTFS}/usr" /usr --ro-bind "${ROOTFS}/etc" /etc
      --ro-bind-try /etc/resolv.conf /etc/resolv.conf --ro-bind-try /etc/hosts /etc/hosts
      --ro-bind-try "${bundle}" "${bundle}"
      --dev /dev --proc /proc --tmpfs /run --bind /tmp /tmp)
for link in bin lib lib64 sbin; do  # merged /usr: these are symlinks into it
    [[ -L "${ROOTFS}/${link}" ]] && args+=(--symlink "$(readlink "${ROOTFS}/${link}")" "/${link}")
done
while IFS= read -r entry; do
    [[ -n "${entry}" ]] || continue
    path="${entry#*:}"
    if [[ "${entry}" == ro:* ]]; then args+=(--ro-bind "${path}" "${path}"); else args+=(--bind "${path}" "${path}"); fi
done < <(printf '%s\n' "${shared[@]}" | awk '{ print length($0) "\t" $0 }' | sort -n | cut -f2-)

exec bwrap "${args[@]}" --chdir "${cwd}" --die-with-parent "${PYTHON}" "$@"
