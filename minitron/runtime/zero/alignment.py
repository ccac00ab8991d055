"""Where ZeRO's partitions start: a fact the optimizer and the estimator both need.

Stages 1-2 flatten each parameter group into one buffer and cut it into dp equal partitions.
The buffer is padded so that dp x NCCL_START_ALIGNMENT_FACTOR divides it: every partition then
starts on an element boundary of 2 (4 bytes of fp16), which NCCL's kernels want. The padding is
real memory, so ``minitron estimate`` counts it too (training/theoretical_zero.py); it imports
this module, which needs no torch.
"""

NCCL_START_ALIGNMENT_FACTOR = 2  # elements
