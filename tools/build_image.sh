#!/usr/bin/env bash
# Build the OCI bundle the container tests (and a user) run: a Debian 12 rootfs from Debian's own
# packages (debootstrap) + python3 + Slurm's client (the supervisor and rank 0 call scontrol) +
# slurmtrain's dependencies (the same torch CPU wheel and pins as .venv, from pip's configured
# find-links/indexes) + slurmtrain itself, all in the image's system Python: Slurm gives the
# container the job's environment (the host's PATH), so plain `python3` must find them. Root only
# (debootstrap, chroot). Prints the bundle path on its last line; build time and size on stderr.
#
# Cached per machine, keyed by its inputs, so CI builds it once:
#   $CACHE/rootfs-<deps key>/   Debian + python3 + dependencies: key = this script + pyproject's deps
#   $CACHE/bundle-<deps key>-<src key>/{config.json,rootfs/}   a standard OCI bundle: a hard-linked
#   copy of that rootfs (seconds, no space) plus slurmtrain at this source, and runc's spec adjusted
#   (tools/oci_spec.py). A source change costs a copy and a 1 s install, not a new rootfs.
# Usage: tools/build_image.sh [--mount DIR]... [--print]
#   --mount DIR: bind-mount DIR read-write at the same path (your runs_root: Slurm's --container
#                mounts nothing itself, and slurmtrain refuses an image that does not mount it);
#                default: $SLURMTRAIN_RUNS_ROOT, else /tmp (the tests' runs roots live there)
#   --print:     only print the path the bundle would have
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${SLURMTRAIN_IMAGE_CACHE:-/var/cache/slurmtrain/images}
SUITE=bookworm
MIRROR=${SLURMTRAIN_DEBIAN_MIRROR:-http://deb.debian.org/debian}

mounts=() print=
while [ "$#" -gt 0 ]; do
    case "$1" in
        --mount) mounts+=("$(realpath -m "$2")"); shift 2 ;;
        --print) print=1; shift ;;
        *) echo "build_image: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
[ "${#mounts[@]}" -gt 0 ] || mounts=("$(realpath -m "${SLURMTRAIN_RUNS_ROOT:-/tmp}")")
# The rootfs depends on this script and pyproject's dependency list only (not its other tables).
deps=$(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
deps_key=$( (cat tools/build_image.sh; echo "$deps") | sha256sum | cut -c1-12)
# The package's source as pip would install it (tracked + untracked, not ignored), the spec
# script and the mounts: what the bundle (not the shared rootfs) depends on.
src_key=$( (git ls-files -co --exclude-standard -- slurmtrain conf sbatch_templates hydra_plugins \
    pyproject.toml tools/oci_spec.py | LC_ALL=C sort | xargs -d '\n' sha256sum; \
    printf '%s\n' "${mounts[@]}") | sha256sum | cut -c1-12)
rootfs=$CACHE/rootfs-$deps_key
bundle=$CACHE/bundle-$deps_key-$src_key
if [ -n "$print" ]; then
    echo "$bundle"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || { echo "build_image: needs root (debootstrap, chroot)" >&2; exit 2; }
for tool in debootstrap runc; do
    command -v "$tool" >/dev/null || { echo "build_image: $tool missing: apt-get install -y debootstrap runc" >&2; exit 2; }
done
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-$deps_key"
flock 9  # one builder per key on this machine; the others wait, then find it built
if [ -f "$bundle/config.json" ]; then
    echo "$bundle"
    exit 0
fi
start=$(date +%s)

# pip inside the image uses the host pip's configuration (find-links with the CPU torch wheel,
# local indexes): `pip config list` lines like global.find-links='/opt/wheels' -> PIP_FIND_LINKS.
pip_env=()
while IFS= read -r line; do
    key=${line%%=*} val=${line#*=}
    val=${val#\'} val=${val%\'}
    pip_env+=("PIP_$(echo "${key#*.}" | tr 'a-z-' 'A-Z_')=$val")
done < <(python3 -m pip config list 2>/dev/null || true)

unmount_under() {  # before any rm -rf: a killed build leaves the host's dirs bind-mounted inside
    local m
    for m in $(awk -v d="$1" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
        umount "$m" || { echo "build_image: cannot unmount $m; not deleting $1" >&2; return 1; }
    done
}

in_root() {  # a command inside the rootfs, with pip's local wheel sources and the host's DNS
    local m
    for m in /proc /opt/wheels /opt/pypi /opt/pypi-more; do
        [ -d "$m" ] || continue
        mkdir -p "$rootfs$m"
        mountpoint -q "$rootfs$m" || mount --bind "$m" "$rootfs$m"
    done
    cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
    [ -f /etc/pip.conf ] && cp /etc/pip.conf "$rootfs/etc/pip.conf"
    [ -d /etc/xdg/pip ] && mkdir -p "$rootfs/etc/xdg" && cp -r /etc/xdg/pip "$rootfs/etc/xdg/"  # constraints
    # pip trusts what the host's pip trusts (a site's proxy CA), for the build only
    local ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
    cp "$ca" "$rootfs/tmp/build-ca.crt"
    local rc=0
    chroot "$rootfs" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "${pip_env[@]}" \
        PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 PIP_CERT=/tmp/build-ca.crt \
        "$@" || rc=$?
    rm -f "$rootfs/tmp/build-ca.crt"
    unmount_under "$rootfs/" || return 1
    return "$rc"
}

if [ ! -f "$rootfs/.complete" ]; then
    if [ ! -f "$rootfs/.debootstrapped" ]; then  # the slow half (~5 min here): kept on a pip failure
        unmount_under "$rootfs/" && unmount_under "$rootfs.tmp/" && rm -rf "$rootfs" "$rootfs.tmp"
        echo "build_image: debootstrap $SUITE into $rootfs" >&2
        debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates,slurm-client \
            "$SUITE" "$rootfs.tmp" "$MIRROR" >&2
        mv "$rootfs.tmp" "$rootfs"
        touch "$rootfs/.debootstrapped"
    fi
    # Dependencies only (the package itself goes in per source key below), from pyproject.toml.
    mapfile -t dep_list <<<"$deps"
    in_root python3 -m pip install --quiet --break-system-packages "${dep_list[@]}" >&2
    in_root python3 -c 'import torch, deepspeed, transformers; print("build_image: torch", torch.__version__, "deepspeed", deepspeed.__version__)' >&2
    rm -rf "$rootfs/root/.cache" "$rootfs/var/cache/apt/archives"/*.deb
    touch "$rootfs/.complete"
fi

# slurmtrain at this source: a wheel built on the host, installed without dependencies.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip wheel --quiet --no-deps --no-build-isolation -w "$work" . >&2 2>/dev/null \
    || .venv/bin/python -m pip wheel --quiet --no-deps --no-build-isolation -w "$work" . >&2
unmount_under "$bundle.tmp/" && rm -rf "$bundle.tmp"
mkdir -p "$bundle.tmp"
cp -al "$rootfs" "$bundle.tmp/rootfs"  # hard links: pip below only adds files
base=$rootfs
rootfs=$bundle.tmp/rootfs  # in_root now works in the copy
wheel=$(cd "$work" && echo slurmtrain-*.whl)
cp "$work/$wheel" "$rootfs/tmp/"
in_root python3 -m pip install --quiet --no-deps --break-system-packages "/tmp/$wheel" >&2
rm -f "$rootfs/tmp/$wheel" "$rootfs/.complete"
# runc's default spec, adjusted for training ranks (tools/oci_spec.py says what and why).
(cd "$bundle.tmp" && runc spec)
python3 tools/oci_spec.py "$bundle.tmp/config.json" "${mounts[@]/#/--mount=}"
mv "$bundle.tmp" "$bundle"
# Old source versions: keep the newest few (a run queued a while ago may still start from one);
# rootfs of other dependency sets go (1.6 GB each), unless their builder holds its lock now.
ls -dt "$CACHE"/bundle-* | tail -n +6 | xargs -r rm -rf
for old in "$CACHE"/rootfs-*; do
    [ "$old" = "$base" ] && continue
    key=${old##*/rootfs-} key=${key%.tmp}
    (flock -n 8 && unmount_under "$old/" && rm -rf "$old") 8>"$CACHE/.lock-$key" || true
done
end=$(date +%s)
size=$(du -sh "$base" | cut -f1)
echo "build_image: bundle $bundle (rootfs $base, $size) in $((end - start)) s" >&2
echo "$bundle"
