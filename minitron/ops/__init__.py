"""DeepSpeed's ``deepspeed/ops``: the optimizers its engine builds from a ds_config, which
DeepSpeed runs as fused kernels (CUDA, or a JIT-built C++ extension on its CPU accelerator)
and minitron runs in plain torch, with the same arithmetic and the same state."""
