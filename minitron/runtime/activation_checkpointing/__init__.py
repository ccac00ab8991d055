"""ZeRO-R's activation side, as ``deepspeed/runtime/activation_checkpointing``: the ds_config's
``activation_checkpointing`` section (config.py) and the checkpoint that partitions what it keeps
across the tensor-parallel ranks or moves it to host memory (checkpointing.py).

Importing the package does not import torch: the config is read before any rank starts.
"""
