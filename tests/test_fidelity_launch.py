"""The launcher's per-rank environment and Slurm/MPI discovery, against torchrun, DeepSpeed and
Megatron (#12 items 3, 7, 13).

torchrun's values were captured by running torch 2.13's `torchrun --standalone --nproc-per-node 2`
on a script that prints its environment; DeepSpeed's from reading deepspeed/launcher/launch.py
(CROSS_RANK = node rank, CROSS_SIZE = nodes, LOCAL_SIZE = processes on this node, and
``--local_rank=N`` put before the script's own arguments unless --no_local_rank).
"""

from __future__ import annotations

import uuid

import pytest

from minitron.comm.comm import DiscoveryError, with_master_addr
from minitron.comm.utils import discover_world_info, expand_hostlist, slurm_tasks_on_node
from minitron.launcher.launch import LaunchConfig, Target, rank_env, rank_target

# torchrun --standalone --nproc-per-node 2, rank 1 (MASTER_ADDR/PORT and the run id vary by run).
TORCHRUN_RANK1 = {
    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "RANK": "1",
    "ROLE_NAME": "default", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2", "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_USE_AGENT_STORE": "True", "WORLD_SIZE": "2",
}


def test_rank_env_has_torchruns_and_deepspeeds_variables():
    cfg = LaunchConfig(world_size=2, master_port=29512)
    env0, env1 = rank_env(0, cfg), rank_env(1, cfg)
    assert {k: env1[k] for k in TORCHRUN_RANK1} == TORCHRUN_RANK1
    assert env0["TORCHELASTIC_RUN_ID"] == env1["TORCHELASTIC_RUN_ID"]        # one id per job...
    uuid.UUID(env0["TORCHELASTIC_RUN_ID"])                                   # ...a uuid, as --standalone makes
    assert LaunchConfig(world_size=2).run_id != cfg.run_id                   # and a new one per job
    assert (env1["CROSS_RANK"], env1["CROSS_SIZE"], env1["LOCAL_SIZE"]) == ("0", "1", "2")


def test_local_rank_argument_as_deepspeed_passes_it():
    target = Target(module="m", argv=["--x", "1"])
    assert rank_target(3, LaunchConfig(world_size=4), target).argv == ["--x", "1"]   # default: torchrun's way
    with_arg = rank_target(3, LaunchConfig(world_size=4, local_rank_arg=True), target)
    assert with_arg.argv == ["--local_rank=3", "--x", "1"]
    assert with_arg.command()[-3:] == ["--local_rank=3", "--x", "1"]
    with pytest.raises(ValueError, match="Python function"):
        rank_target(0, LaunchConfig(world_size=1, local_rank_arg=True), Target(function=lambda: 0))


# Slurm (item 3). Host lists expand as `scontrol show hostnames` does; SLURM_TASKS_PER_NODE holds
# the "2(x3),1" form, in node-list order, read at this node's SLURM_NODEID.
def test_slurm_master_is_the_first_host_of_a_multi_bracket_list():
    assert expand_hostlist("rack[1-2]-node[01-02],login") == [
        "rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02", "login"]
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "rack[1-2]-node[01-04]", "SLURM_TASKS_PER_NODE": "4(x2)"}
    info = discover_world_info(env)
    assert (info.master_addr, info.rank, info.local_rank, info.local_world_size) == ("rack1-node01", 5, 1, 4)


@pytest.mark.parametrize("env, tasks", [
    ({"SLURM_NTASKS_PER_NODE": "4,2", "SLURM_NODEID": "1"}, "2"),      # a comma list no longer crashes
    ({"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "2"}, "2"),
    ({"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}, "1"),
    ({"SLURM_TASKS_PER_NODE": "3", "SLURM_NTASKS_PER_NODE": "9"}, "3"),  # what srun placed wins
])
def test_slurm_tasks_on_this_node(env, tasks):
    assert slurm_tasks_on_node(env) == tasks


# MPI and torchrun (item 7).
def test_mpi_across_nodes_without_master_addr_is_refused_not_guessed():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    info = discover_world_info(env)
    assert info.master_addr is None                     # never 127.0.0.1 for a multi-node job
    try:  # with mpi4py installed, DeepSpeed's broadcast of rank 0's address is used instead
        import mpi4py  # noqa: F401
    except ImportError:
        with pytest.raises(DiscoveryError, match="export MASTER_ADDR"):
            with_master_addr(info)
    one_node = discover_world_info({**env, "OMPI_COMM_WORLD_SIZE": "4"})
    assert with_master_addr(one_node).master_addr == "127.0.0.1"
    given = discover_world_info({**env, "MASTER_ADDR": "node7"})
    assert with_master_addr(given).master_addr == "node7"


def test_missing_local_rank_is_zero_as_in_megatron():
    # Megatron: int(os.getenv("LOCAL_RANK", "0")).
    assert discover_world_info({"RANK": "5", "WORLD_SIZE": "8"}).local_rank == 0
