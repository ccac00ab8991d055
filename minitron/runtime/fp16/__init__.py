"""DeepSpeed's ``runtime/fp16``: here only its ``onebit`` optimizers' home (minitron's fp16 master
weights live in zero/stage_1_and_2.py, which serves stage 0 too)."""
