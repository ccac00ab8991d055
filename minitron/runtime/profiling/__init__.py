"""``deepspeed/profiling/``: the flops profiler (flops_profiler.py counts, report.py prints)."""
