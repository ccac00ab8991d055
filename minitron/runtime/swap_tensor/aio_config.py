"""The ds_config's ``aio`` section: DeepSpeed's ``runtime/swap_tensor/aio_config.py``.

DeepSpeed hands these to its async I/O library (``deepspeed.ops.aio``, libaio, or NVIDIA's
GPUDirect Storage with use_gds): requests of ``block_size`` bytes, up to ``queue_depth`` of them
in flight, split over ``intra_op_parallelism`` threads, submitted one by one or together
(``single_submit``), completions reaped while others run (``overlap_events``). minitron writes
and reads the swap files with plain, blocking file I/O, so of these only the two that decide the
*files* are used, as the swapper uses them (swap_tensor/optimizer_swapper.py):

    intra_op_parallelism x 1024 bytes   every swapped tensor's length is padded to a multiple
                                        (each I/O thread gets whole 1 KiB blocks)
    max(1 MiB, block_size)              a tensor smaller than this stays in host memory: too
                                        small for the I/O to pay

The others are checked and change only how fast the bytes move.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, flag, json_value, positive_int

AIO_KEYS = ("block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events", "use_gds")
AIO_ALIGNED_BYTES = 1024      # deepspeed/runtime/swap_tensor/utils.py
MIN_AIO_BYTES = 1024 ** 2


@dataclass
class AioConfig:
    block_size: int = 1048576
    queue_depth: int = 8
    intra_op_parallelism: int = 1
    single_submit: bool = False
    overlap_events: bool = True
    use_gds: bool = False

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def aligned_bytes(self) -> int:
        return AIO_ALIGNED_BYTES * self.intra_op_parallelism

    @property
    def min_swap_bytes(self) -> int:
        return max(MIN_AIO_BYTES, self.block_size)


def parse_aio(params: dict) -> AioConfig:
    section = params.get("aio")
    if section is None:
        return AioConfig()
    if not isinstance(section, dict):
        raise DeepSpeedConfigError(f"aio must be an object, got {json_value(section)}")
    check_keys(section, AIO_KEYS, {}, "aio")
    out = AioConfig(**{key: positive_int(section, key, where="aio") if key in section else default
                       for key, default in (("block_size", 1048576), ("queue_depth", 8),
                                            ("intra_op_parallelism", 1))},
                    single_submit=flag(section, "single_submit", False, "aio"),
                    overlap_events=flag(section, "overlap_events", True, "aio"),
                    use_gds=flag(section, "use_gds", False, "aio"))
    if out.use_gds:   # DeepSpeed asserts a CUDA accelerator, then reads straight into GPU memory
        raise DeepSpeedConfigError("aio.use_gds: GPUDirect Storage (files read straight into GPU memory) is not "
                                   "built in minitron, which swaps through host memory; remove it")
    return out
