"""DeepSpeed's ``ops/quantizer``: the blockwise int8/int4 quantizer ZeRO++ sends weights and
gradients through (quantizer.py). DeepSpeed runs it as CUDA kernels only; minitron runs the same
arithmetic in torch, so that ZeRO++ runs on gloo CPU ranks."""
