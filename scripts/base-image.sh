#!/usr/bin/env bash
# Makes the base image `hunch-base:bookworm`: a Debian bookworm (minbase) root file system made
# with debootstrap from Debian's packages and imported into the container engine, so no image is
# ever pulled from a registry. Does nothing when the image exists. Used by scripts/build-image.sh
# (Hunch's image) and tests/gpu/imitation.sh (the GPU machine's imitation).
#
# debootstrap makes device nodes and chroots, and the tree it makes is root's: making the base
# needs root. As another user every root step goes through sudo, which must then be there.
# Env: HUNCH_DEBIAN_MIRROR (debootstrap's mirror; default http://deb.debian.org/debian).
set -euo pipefail
base="hunch-base:bookworm"
command -v docker >/dev/null || { echo "base-image: docker is not installed" >&2; exit 1; }
if docker image inspect "$base" >/dev/null 2>&1; then
  exit 0
fi
started=$(date +%s)
as_root=""
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "base-image: making the base image needs root (debootstrap): run this as root, install" \
      "sudo, or pass scripts/build-image.sh --base IMAGE (e.g. debian:bookworm)" >&2
    exit 1
  fi
  as_root=sudo
  echo "base-image: making the base image needs root (debootstrap); using sudo"
fi
# Debian installs debootstrap in /usr/sbin, which is not on a user's PATH.
debootstrap="$(PATH="$PATH:/usr/sbin:/sbin" command -v debootstrap || true)"
if [ -z "$debootstrap" ]; then
  echo "base-image: installing debootstrap"
  $as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq debootstrap >/dev/null
  debootstrap="$(PATH="$PATH:/usr/sbin:/sbin" command -v debootstrap)"
fi
rootfs="$(mktemp -d "${TMPDIR:-/tmp}/hunch-rootfs.XXXXXX")"
trap '$as_root rm -rf "$rootfs"' EXIT
echo "base-image: debootstrap bookworm (minbase) into $rootfs"
$as_root "$debootstrap" --variant=minbase bookworm "$rootfs" \
  "${HUNCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
  > "$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; exit 1; }
rm -f "$rootfs.log"
# What debian:bookworm has too: no apt caches, no recommends.
$as_root sh -c 'rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' - "$rootfs"
echo 'APT::Install-Recommends "false";' \
  | $as_root tee "$rootfs/etc/apt/apt.conf.d/00-no-recommends" >/dev/null
$as_root tar -C "$rootfs" --numeric-owner -c . | docker import \
  --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  - "$base" >/dev/null
$as_root rm -rf "$rootfs"
trap - EXIT
echo "base-image: imported $base ($(( $(date +%s) - started )) s)"
