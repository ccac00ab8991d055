"""Cluster descriptions for `minitron estimate --cluster`: what the time model needs to know of
the machine, and nothing else. A description is a GPU (its dense peak, its memory and the
memory's bandwidth) and two links: the one inside a node (NVLink) and the one between nodes
(InfiniBand), each a bandwidth per GPU per direction and a latency per message.

Two are built in, one DGX-class node of eight H100 or H200 SXM GPUs. A user describes their own
in a small JSON or TOML file with the same keys (``--cluster FILE``); every key is required,
an unknown one is refused, and each refusal is one line that names the key and what it wants.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from minitron.training.theoretical_flops import PEAK_TFLOPS


class ClusterError(ValueError):
    """A description that cannot be used; the message is the one line the user sees."""


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    peak_tflops: float          # dense bf16 tensor-core peak, TFLOP/s
    memory_gib: float           # HBM capacity, GiB: whether a layout's largest rank fits
    memory_tb_s: float          # HBM bandwidth, TB/s (shown; the model below is GEMM-bound)
    nvlink_gb_s: float          # per GPU, per direction, GB/s (10**9 bytes)
    nvlink_latency_us: float    # per message
    ib_gb_s: float              # per GPU (one NIC each), per direction, GB/s
    ib_latency_us: float        # per message

    def as_json(self) -> dict:
        return asdict(self)


# Sources, all vendor specifications:
# * dense bf16 peak: theoretical_flops.PEAK_TFLOPS (NVIDIA's H100 and H200 SXM data sheets:
#   1,979 TFLOP/s "with sparsity", halved for dense);
# * HBM: H100 SXM 80 GB of HBM3 at 3.35 TB/s; H200 SXM 141 GB of HBM3e at 4.8 TB/s (the same
#   data sheets). 80 GB = 74.5 GiB and 141 GB = 131.3 GiB, the capacities in GiB below;
# * NVLink 4: 900 GB/s of total bandwidth per GPU (18 links of 50 GB/s), i.e. 450 GB/s in each
#   direction, for both parts (the data sheets' "NVLink: 900GB/s");
# * InfiniBand: a DGX H100 / H200 node has eight ConnectX-7 ports of NDR 400 Gb/s, one per GPU
#   (NVIDIA's DGX H100 and DGX H200 user guides): 400 / 8 = 50 GB/s per GPU per direction.
# The latencies are NOT specifications (no vendor states a per-message latency for a
# collective): 1 µs through NVLink and 5 µs across InfiniBand are our round assumptions, the
# order of a few microseconds that NCCL's small-message timings show. They matter only for the
# many small calls (the broadcasts, the loss, the norms); the bandwidth terms dominate.
_DGX_LINKS = dict(gpus_per_node=8, nvlink_gb_s=450.0, nvlink_latency_us=1.0, ib_gb_s=50.0, ib_latency_us=5.0)
BUILT_IN = {
    "h100": Cluster("h100", peak_tflops=PEAK_TFLOPS["h100"], memory_gib=round(80e9 / 2**30, 1),
                    memory_tb_s=3.35, **_DGX_LINKS),
    "h200": Cluster("h200", peak_tflops=PEAK_TFLOPS["h200"], memory_gib=round(141e9 / 2**30, 1),
                    memory_tb_s=4.8, **_DGX_LINKS),
}
KEYS = [k for k in Cluster.__dataclass_fields__ if k != "name"]


def load_cluster(text: str) -> Cluster:
    """A built-in name (h100, h200) or a path to a .json or .toml file of the keys in KEYS."""
    if text.lower() in BUILT_IN:
        return BUILT_IN[text.lower()]
    path = Path(text)
    if not path.is_file():
        raise ClusterError(f"--cluster {text!r}: not a built-in ({', '.join(BUILT_IN)}) nor a file; "
                           f"give one, or a .json/.toml file with {', '.join(KEYS)}")
    try:
        if path.suffix.lower() == ".toml":
            import tomllib   # lazy: Python 3.11's, and pyproject allows 3.10, where only a .toml file needs it
            data = tomllib.loads(path.read_text())
        else:
            data = json.loads(path.read_text())
    except (ValueError, OSError, UnicodeDecodeError) as exc:   # tomllib's and json's errors are ValueErrors
        raise ClusterError(f"--cluster {text}: cannot read it as {'TOML' if path.suffix.lower() == '.toml' else 'JSON'}"
                           f" ({str(exc).splitlines()[0]})") from None
    return cluster_from(data, f"--cluster {text}", default_name=path.stem)


def cluster_from(data, where: str, default_name: str = "custom") -> Cluster:
    """A Cluster from a mapping, every key checked; ``where`` starts each one-line refusal."""
    if not isinstance(data, dict):
        raise ClusterError(f"{where}: want an object of {', '.join(KEYS)}")
    unknown = sorted(set(data) - set(KEYS) - {"name"})
    if unknown:
        raise ClusterError(f"{where}: unknown key {unknown[0]!r}; the keys are name (optional), {', '.join(KEYS)}")
    missing = [k for k in KEYS if k not in data]
    if missing:
        raise ClusterError(f"{where}: missing {', '.join(missing)} (every key but name is required)")
    values = {}
    for key in KEYS:
        value = data[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key == "gpus_per_node":
            if not (number and value == int(value) and value >= 1):
                raise ClusterError(f"{where}: gpus_per_node {value!r}: want a whole number of GPUs, at least 1")
            values[key] = int(value)
        elif not (number and 0 < value < math.inf):
            raise ClusterError(f"{where}: {key} {value!r}: want a number above 0")
        else:
            values[key] = float(value)
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ClusterError(f"{where}: name {name!r}: want a non-empty string")
    return Cluster(name, **values)
