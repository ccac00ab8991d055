"""Per-rank processes: the job of DeepSpeed's runner.py and launch.py, in minitron's own code."""

from minitron.launcher.harness import run_on_ranks
from minitron.launcher.failures import JobHung, RankFailure
from minitron.launcher.launch import LaunchConfig, launch
from minitron.launcher.ports import free_port
from minitron.launcher.worker import Target, session_env

__all__ = ["JobHung", "LaunchConfig", "RankFailure", "Target", "free_port", "launch", "run_on_ranks", "session_env"]
