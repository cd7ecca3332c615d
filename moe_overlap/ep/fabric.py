"""NCCL fabrics for one host: the native one, and an emulated inter-node link (torch-free: environment only).

On one host NCCL moves EP all-to-alls over NVLink (its P2P transport, driven by SMs). A cluster's EP
group usually spans nodes, where the bytes go through the network (400 Gb/s NICs: about 50 GB/s per GPU,
with NCCL's network proxy in the path). ``emulated-net`` makes one host behave like that: P2P and shared
memory transports off, so NCCL falls back to its network transport, here TCP sockets over loopback. That
is the regime where overlap pays most (communication comparable to or longer than the expert compute),
and it lets users see it before renting a cluster. Its bandwidth is what loopback sockets give, not a
NIC's: benchmarks/gpu/ep_overlap.py measures it in the same run (the all-to-alls alone) and the docs compare
it with a 400 Gb/s NIC (docs/benchmarks.md, "Emulated inter-node fabric").

NCCL reads these variables when a communicator is created, for the whole process: they must be in the
environment of every rank before ``init_process_group`` (the verification launcher and the benchmarks
put them there). Every communicator of the rank uses the fabric, the gradient all-reduce included.
"""

from __future__ import annotations

FABRICS: dict[str, dict[str, str]] = {
    "native": {},
    "emulated-net": {
        "NCCL_P2P_DISABLE": "1",  # no NVLink / PCIe peer copies
        "NCCL_SHM_DISABLE": "1",  # no shared-memory transport: what remains is the network one
        "NCCL_NET": "Socket",  # TCP sockets (no InfiniBand / RoCE plugin on one host)
        "NCCL_SOCKET_IFNAME": "lo",  # loopback: NCCL skips it by default
        # More sockets and helper threads than NCCL's default for one socket link: loopback is CPU-bound.
        "NCCL_SOCKET_NTHREADS": "4",
        "NCCL_NSOCKS_PERTHREAD": "4",
    },
}


def fabric_env(name: str) -> dict[str, str]:
    """The environment a rank needs for fabric ``name``; ValueError naming the choices otherwise."""
    if name not in FABRICS:
        raise ValueError(f"fabric {name!r}: use one of {sorted(FABRICS)}")
    return dict(FABRICS[name])
