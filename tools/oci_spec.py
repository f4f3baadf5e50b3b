"""Adjust `runc spec`'s default config.json for training ranks (used by tools/build_image.sh).

Why each change: ranks rendezvous over TCP (gloo/NCCL) on the node's address, so the container
shares the host's network, hostname, IPC and pids (no network/uts/ipc/pid namespaces; host /dev/shm, not
runc's 64 KB one); Slurm starts it non-interactively (no terminal) and sets the environment; the
image is shared by every rank and run, so its root is read-only with a private /tmp; Slurm's
client (scontrol for requeues) reaches the host's controller through /etc/slurm and /run/munge. The runs
roots (--mount) are bind-mounted read-write at the same path (slurmtrain/login/container.py).
Standalone (stdlib only): it runs with the host's python3 before any venv exists.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# pid too: ranks record their pids in the ledger (stack dumps, the node-failure drill signal them);
# in a pid namespace every rank would be pid 1 of its own container.
HOST_NAMESPACES_SHARED = {"network", "uts", "ipc", "pid"}


Json = dict[str, object]  # one JSON object of the spec


def _object(parent: Json, key: str) -> Json:
    """`parent[key]`, which runc's default spec always has as an object."""
    value = parent[key]
    assert isinstance(value, dict), f"{key}: not an object in the spec"
    return value


def _objects(parent: Json, key: str) -> list[Json]:
    """`parent[key]`, which runc's default spec always has as a list of objects."""
    value = parent[key]
    assert isinstance(value, list) and all(isinstance(v, dict) for v in value), key
    return value


def adjust(spec: Json, extra: list[str]) -> Json:
    spec["root"] = {"path": "rootfs", "readonly": True}
    proc = _object(spec, "process")
    proc["terminal"] = False
    proc["args"] = ["python3"]
    proc["cwd"] = "/"
    proc["env"] = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp"]
    proc.pop("rlimits", None)  # the task's own limits (Slurm propagates them); raising them fails
    linux = _object(spec, "linux")
    linux["namespaces"] = [
        ns for ns in _objects(linux, "namespaces") if ns["type"] not in HOST_NAMESPACES_SHARED
    ]
    spec.pop("hostname", None)
    mounts = [m for m in _objects(spec, "mounts") if m["destination"] != "/dev/shm"]
    mounts += [
        {"destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]},
        # Slurm hands the container the job's HOME: caches (torch, triton) need it writable
        {
            "destination": "/root",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev"],
        },
        {
            "destination": "/etc/hosts",
            "type": "bind",
            "source": "/etc/hosts",
            "options": ["rbind", "ro"],
        },
        {
            "destination": "/etc/resolv.conf",
            "type": "bind",
            "source": "/etc/resolv.conf",
            "options": ["rbind", "ro"],
        },
    ]
    # Slurm's client in the image talks to the host's controller: its config and munge socket.
    for path in ("/etc/slurm", "/run/munge"):
        mounts.append({"destination": path, "type": "bind", "source": path, "options": ["rbind"]})
    # The runs roots, read-write at the same path: checkpoints, ledger and logs are written there.
    mounts += [
        {"destination": d, "type": "bind", "source": d, "options": ["rbind", "rw"]} for d in extra
    ]
    spec["mounts"] = mounts
    return spec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", type=Path)
    p.add_argument("--mount", action="append", default=[], help="a directory to bind read-write")
    a = p.parse_args()
    loaded = json.loads(a.config.read_text())
    assert isinstance(loaded, dict), f"{a.config}: not a runc spec"
    spec = adjust(loaded, a.mount)
    a.config.write_text(json.dumps(spec, indent=2) + "\n")


if __name__ == "__main__":
    main()
