"""minitron's overlap rules against Megatron-Core 0.19.2's own code (marked mcore).

* bucket sizes: resolve_bucket_size gives what Megatron's resolve_ddp_bucket_size gives, for
  the default and an explicit --ddp-bucket-size, with and without --overlap-grad-reduce, at
  small and large dp (its default grows with dp past 40);
* flags: the combinations of --overlap-grad-reduce, --overlap-param-gather and
  --use-distributed-optimizer that Megatron's validate_args accepts, minitron accepts, and the
  ones it stops (an assertion there), minitron refuses in one line.
"""

from __future__ import annotations

import tempfile
from types import SimpleNamespace

import pytest
import torch

from minitron.cli.common import UserError, validate_pretrain
from minitron.core.distributed.distributed_data_parallel_config import resolve_bucket_size

pytestmark = pytest.mark.mcore
try:
    from megatron.core.distributed import DistributedDataParallelConfig as McoreDDPConfig
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.training import resolve_ddp_bucket_size
except ImportError as exc:
    pytest.skip(f"megatron.training does not import ({exc}): the mcore extra (Python >= 3.12)",
                allow_module_level=True)

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "1", "--mock-data", "--vocab-size", "64"]


@pytest.fixture(scope="module")
def world():
    # Megatron asks the group its size only once torch.distributed is up; a world of one does.
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("dp", [1, 8, 40, 64, 1024])
@pytest.mark.parametrize("bucket_size", [None, 1000])
@pytest.mark.parametrize("overlap", [False, True])
def test_bucket_size_is_megatrons(world, dp, bucket_size, overlap):
    group = SimpleNamespace(size=lambda: dp)
    theirs = resolve_ddp_bucket_size(McoreDDPConfig(bucket_size=bucket_size), group, overlap, 10**9)
    assert resolve_bucket_size(bucket_size, overlap, dp) == theirs


def _megatron_accepts(flags, monkeypatch) -> bool:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("sys.argv", ["pretrain_gpt.py", *MODEL, "--tokenizer-type", "NullTokenizer", *flags])
    try:
        validate_args(parse_args())
    except AssertionError:
        return False
    return True


def _minitron_accepts(flags) -> bool:
    try:
        validate_pretrain([*MODEL, *flags], world=2)
    except UserError as refusal:
        assert "\n" not in str(refusal)
        return False
    return True


@pytest.mark.parametrize("flags", [
    ["--overlap-grad-reduce"],
    ["--overlap-grad-reduce", "--use-distributed-optimizer"],
    ["--overlap-grad-reduce", "--overlap-param-gather", "--use-distributed-optimizer"],
    ["--overlap-param-gather", "--use-distributed-optimizer"],
    ["--overlap-grad-reduce", "--overlap-param-gather"],
    ["--overlap-grad-reduce", "--ddp-bucket-size", "1000"],
])
def test_the_same_flag_combinations_run(flags, monkeypatch):
    assert _minitron_accepts(flags) == _megatron_accepts(flags, monkeypatch)
