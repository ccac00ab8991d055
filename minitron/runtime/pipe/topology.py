"""DeepSpeed's process topology (``deepspeed/runtime/pipe/topology.py``): ranks as points of a
grid with named axes, and the groups a pipeline needs.

A topology lists its axes slowest first; the last axis varies fastest along the ranks.
DeepSpeed puts data parallelism last in ``PipeDataParallelTopology`` (``pipe, data``), so that
the replicas of one stage, which all-reduce every gradient, sit on neighbouring ranks (one
node), while the pipeline, which sends one activation per micro-batch, may cross nodes. With
tensor parallelism (``PipeModelDataParallelTopology``) the order is ``pipe, data, model``: the
tensor group, which talks in every layer, is innermost. That is Megatron's default order too
(tp-cp-ep-dp-pp, fastest first), so a Megatron-DeepSpeed run's two views of the ranks agree.
"""

from __future__ import annotations

from collections import namedtuple
from itertools import product

from minitron import comm as dist   # as DeepSpeed's: from deepspeed import comm as dist


class ProcessTopology:
    def __init__(self, axes: list[str], dims: list[int]):
        self.axes, self.dims = list(axes), list(dims)
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)
        # Row-major: enumerate the coordinates with the last axis fastest.
        self.mapping = {self.ProcessCoord(*coord): rank
                        for rank, coord in enumerate(product(*(range(d) for d in self.dims)))}

    def get_rank(self, **coord) -> int:
        if len(coord) != len(self.axes):
            raise ValueError("get_rank() needs every axis; use filter_match() for a slice")
        return self.mapping[self.ProcessCoord(**coord)]

    def get_axis_names(self) -> list[str]:
        return self.axes

    def get_dim(self, axis: str) -> int:
        return self.dims[self.axes.index(axis)] if axis in self.axes else 0

    def get_coord(self, rank: int):
        for coord, r in self.mapping.items():
            if r == rank:
                return coord
        raise ValueError(f"rank {rank} not found in topology")

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """One list per group along ``axis``: the ranks that agree on every other axis."""
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        lists = []
        for coord in product(*(range(self.get_dim(a)) for a in others)):
            fixed = dict(zip(others, coord))
            lists.append([self.mapping[self.ProcessCoord(**fixed, **{axis: i})] for i in range(self.get_dim(axis))])
        return lists

    def filter_match(self, **criteria) -> list[int]:
        return [r for c, r in self.mapping.items() if all(getattr(c, k) == v for k, v in criteria.items())]

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        return self.filter_match(**{axis: idx})

    def world_size(self) -> int:
        return len(self.mapping)


class PipeDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp: int, num_dp: int):
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    def __init__(self, num_pp: int, num_mp: int, num_dp: int):
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])


class PipelineParallelGrid:
    """The groups of a topology, made with new_group on every rank (each creation is collective),
    and the getters the engines ask for: DeepSpeed hands this object to the engine as its
    ``mpu``, in place of Megatron's parallel_state.

    DeepSpeed's "model parallel" group here is everything but data: all stages (and tensor
    ranks) of one pipeline, the group over which a gradient norm or an overflow is agreed."""

    def __init__(self, topology: ProcessTopology):
        self._topo = topology
        self.global_rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if topology.world_size() != self.world_size:
            raise ValueError(f"the topology has {topology.world_size()} ranks, the world {self.world_size}")
        self.data_parallel_size = max(topology.get_dim("data"), 1)
        self.pipe_parallel_size = max(topology.get_dim("pipe"), 1)
        self.model_parallel_size = max(topology.get_dim("model"), 1)
        coord = topology.get_coord(self.global_rank)
        self.stage_id, self.data_parallel_id = coord.pipe, coord.data
        self.is_first_stage = self.stage_id == 0
        self.is_last_stage = self.stage_id == self.pipe_parallel_size - 1
        self.ds_model_proc_group, self.ds_model_rank = self._mine(
            [sorted(topology.get_axis_list("data", d)) for d in range(self.data_parallel_size)])
        self.ds_model_world_size = self.pipe_parallel_size * self.model_parallel_size
        self.dp_groups = topology.get_axis_comm_lists("data")
        self.dp_proc_group, _ = self._mine(self.dp_groups)
        self.dp_group = next(g for g in self.dp_groups if self.global_rank in g)
        self.pipe_groups = topology.get_axis_comm_lists("pipe")
        self.pp_proc_group, _ = self._mine(self.pipe_groups)
        self.pp_group = next(g for g in self.pipe_groups if self.global_rank in g)
        # The tensor-parallel ("slice") group; without a model axis every rank is its own slice.
        slices = topology.get_axis_comm_lists("model") if self.model_parallel_size > 1 else [
            [r] for r in range(self.world_size)]
        self.slice_proc_group, _ = self._mine(slices)

    def _mine(self, rank_lists: list[list[int]]):
        """Create every group (all ranks must take part in each new_group) and keep my own."""
        mine, my_rank = None, -1
        for ranks in rank_lists:
            group = dist.new_group(ranks=ranks)
            if self.global_rank in ranks:
                mine, my_rank = group, ranks.index(self.global_rank)
        return mine, my_rank

    def stage_to_global(self, stage_id: int, **kwargs) -> int:
        """The rank at ``stage_id`` with my other coordinates (those in kwargs replaced)."""
        me = self._topo.get_coord(self.global_rank)
        return self._topo.get_rank(**me._replace(pipe=stage_id, **kwargs)._asdict())

    def topology(self) -> ProcessTopology:
        return self._topo

    def get_global_rank(self) -> int:
        return self.global_rank

    def get_stage_id(self) -> int:
        return self.stage_id

    get_pipe_parallel_rank = get_stage_id

    def get_pipe_parallel_world_size(self) -> int:
        return self.pipe_parallel_size

    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size

    def get_pipe_parallel_group(self):
        return self.pp_proc_group

    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self):
        return self.dp_proc_group

    def get_model_parallel_rank(self) -> int:
        return self.ds_model_rank

    def get_model_parallel_world_size(self) -> int:
        return self.ds_model_world_size

    def get_model_parallel_group(self):
        return self.ds_model_proc_group

    def get_slice_parallel_rank(self) -> int:
        return self._topo.get_coord(self.global_rank).model if "model" in self._topo.axes else 0

    def get_slice_parallel_world_size(self) -> int:
        return self.model_parallel_size

    def get_slice_parallel_group(self):
        return self.slice_proc_group
