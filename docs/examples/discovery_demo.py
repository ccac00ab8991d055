"""Who am I, when no torchrun-style launcher said so? Chapter 5 runs this.

    python docs/examples/discovery_demo.py

Feeds discover_world_info() the environment each kind of launcher leaves behind (examples
written by hand, as srun or mpirun would set them on the second process of the second node)
and prints what minitron concludes.
"""

import textwrap

from minitron.comm.comm import DiscoveryError, with_master_addr
from minitron.comm.utils import discover_world_info

ENVIRONMENTS = {
    "torchrun / minitron launch": {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "node0", "MASTER_PORT": "29500"},
    "srun (Slurm)": {
        "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "rack[1-2]-node[01-04]"},
    "mpirun (Open MPI)": {
        "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "node0"},
    "mpiexec (MPICH / Intel MPI)": {
        "PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4",
        "MASTER_ADDR": "node0"},
    "plain python": {},
    "mpirun, no MASTER_ADDR": {
        "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
}

if __name__ == "__main__":
    for launcher, env in ENVIRONMENTS.items():
        w = discover_world_info(env)
        try:
            where, error = f"rendezvous {with_master_addr(w).master_addr}:{w.master_port}", None
        except DiscoveryError as err:  # mpi4py could broadcast it; without, one line
            where, error = "rendezvous unknown", err
        print(f"{launcher:28} rank {w.rank} of {w.world_size}, local {w.local_rank} of "
              f"{w.local_world_size}, {where}  ({w.source})")
        if error:
            print(textwrap.fill(str(error), 100, initial_indent=" " * 29, subsequent_indent=" " * 29))
