"""Which sample indices each data-parallel rank reads, and from where a resumed run goes on.

A training run is measured in *consumed samples*, not epochs: after iteration i every rank
agrees that ``consumed_samples = i x global_batch_size`` samples have been used (the training
loop adds ``micro_batch_size x dp x num_microbatches`` each step). Given that one number, a
sampler can restart mid-epoch exactly where the interrupted run stopped.

Both samplers hand out indices in rounds of ``micro_batch_size x dp``; within a round, rank r
takes its own slice, so no two data-parallel ranks ever read the same sample in a pass.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state as mpu
from minitron.training.global_vars import get_args



class MegatronPretrainingSampler:
    """Sequential: round k covers indices [k*m*dp, (k+1)*m*dp); rank r takes the r-th m of them.

    Order comes from the dataset (GPTDataset already shuffled its samples), so the sampler can
    stay simple and deterministic. ``--dataloader-type single``.
    """

    def __init__(self, total_samples, consumed_samples, micro_batch_size, data_parallel_rank,
                 data_parallel_size, drop_last=True):
        if total_samples <= 0:
            raise ValueError(f"no sample to consume: the dataset has {total_samples}")
        if consumed_samples >= total_samples:
            raise ValueError(f"no samples left: {consumed_samples} consumed of {total_samples}; "
                             "build the dataset for more samples (raise --train-iters)")
        if micro_batch_size <= 0 or not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"bad sampler geometry: micro batch {micro_batch_size}, "
                             f"dp rank {data_parallel_rank} of {data_parallel_size}")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.drop_last = drop_last

    def __len__(self):
        return self.total_samples

    def get_start_end_idx(self):
        start = self.data_parallel_rank * self.micro_batch_size
        return start, start + self.micro_batch_size

    def __iter__(self):
        batch = []
        for idx in range(self.consumed_samples, self.total_samples):  # resume: skip what was used
            batch.append(idx)
            if len(batch) == self.micro_batch_times_data_parallel_size:
                start, end = self.get_start_end_idx()
                yield batch[start:end]
                batch = []
        if batch and not self.drop_last:
            start, end = self.get_start_end_idx()
            yield batch[start:end]


class MegatronPretrainingRandomSampler:
    """Reshuffled every epoch (seeded by the epoch number). ``--dataloader-type cyclic``.

    With data sharding (the default) each dp rank owns a contiguous bucket of the dataset and
    shuffles inside it; without, one global permutation is dealt out round-robin. Either way
    the position inside the epoch is ``consumed_samples % usable``, so a resumed run continues
    the same permutation.
    """

    def __init__(self, dataset, total_samples, consumed_samples, micro_batch_size,
                 data_parallel_rank, data_parallel_size, data_sharding=True):
        if total_samples <= 0 or micro_batch_size <= 0 or not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"bad sampler geometry: {total_samples} samples, micro batch "
                             f"{micro_batch_size}, dp rank {data_parallel_rank} of {data_parallel_size}")
        self.dataset = dataset
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.data_sharding = data_sharding
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.last_batch_size = total_samples % self.micro_batch_times_data_parallel_size
        if total_samples < self.micro_batch_times_data_parallel_size:
            raise ValueError(f"{total_samples} samples cannot fill one round of micro batch x dp "
                             f"= {self.micro_batch_times_data_parallel_size}")

    def __len__(self):
        return self.total_samples

    def __iter__(self):
        usable = self.total_samples - self.last_batch_size  # whole rounds only
        self.epoch = self.consumed_samples // usable
        in_epoch = self.consumed_samples % usable
        assert in_epoch % self.micro_batch_times_data_parallel_size == 0
        g = torch.Generator()
        g.manual_seed(self.epoch)  # every rank draws the same permutation for this epoch
        if self.data_sharding:
            bucket_size = usable // self.data_parallel_size
            bucket_start = self.data_parallel_rank * bucket_size
            order = torch.randperm(bucket_size, generator=g).tolist()  # host: sample indices, read by the loader
            idx_range = [bucket_start + x for x in order[in_epoch // self.data_parallel_size:]]
        else:
            # One permutation of every whole micro batch's worth of samples, (total // m) * m,
            # dealt out round-robin: as Megatron does. That is more than the whole rounds the
            # epoch counts (``usable``), so some dp ranks may get one batch more than others
            # near an epoch's end; each rank's loader then simply starts its next epoch later.
            order = torch.randperm(self.total_samples // self.micro_batch_size * self.micro_batch_size,  # host: indices
                                   generator=g).tolist()[in_epoch:]
            idx_range = order[self.data_parallel_rank::self.data_parallel_size]
        batch = []
        for idx in idx_range:
            batch.append(idx)
            if len(batch) == self.micro_batch_size:
                self.consumed_samples += self.micro_batch_times_data_parallel_size
                yield batch
                batch = []


def build_pretraining_data_loader(dataset, consumed_samples, args=None, data_parallel_rank=None,
                                  data_parallel_size=None):
    """A torch DataLoader over ``dataset`` for this rank, resuming after ``consumed_samples``.

    ``args`` defaults to the global args; the dp rank and size to parallel_state's (tests may
    pass them explicitly).
    """
    if dataset is None or len(dataset) == 0:  # not built on this rank, or nothing asked of it
        return None
    if args is None:
        args = get_args()
    if data_parallel_rank is None or data_parallel_size is None:
        data_parallel_rank = mpu.get_data_parallel_rank()
        data_parallel_size = mpu.get_data_parallel_world_size()
    dataloader_type = args.dataloader_type  # validate_args made None "single"
    if dataloader_type == "single":
        batch_sampler = MegatronPretrainingSampler(
            len(dataset), consumed_samples, args.micro_batch_size, data_parallel_rank, data_parallel_size)
    elif dataloader_type == "cyclic":
        batch_sampler = MegatronPretrainingRandomSampler(
            dataset, len(dataset), consumed_samples, args.micro_batch_size, data_parallel_rank,
            data_parallel_size, args.data_sharding)
    elif dataloader_type == "external":
        return dataset  # the user's own iterable: it does its own sampling
    else:
        raise ValueError(f"--dataloader-type {dataloader_type} is not one of single, cyclic, external")
    num_workers = args.num_workers
    # A generator of the loader's own: each new iterator draws a base seed for its workers, and
    # drawing it from torch's global generator would shift the model's dropout stream — a
    # resumed run would then no longer repeat the uninterrupted one.
    generator = torch.Generator().manual_seed(args.seed)
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=batch_sampler, num_workers=num_workers, generator=generator,
        pin_memory=torch.cuda.is_available(), persistent_workers=num_workers > 0)
