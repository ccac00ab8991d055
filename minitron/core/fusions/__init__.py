"""Megatron's fusions, opt-in: each a few elementwise ops that ``jit_fuser`` (core/jit.py)
compiles into one kernel. The layers call them only when the config asks
(``bias_activation_fusion``, ``bias_dropout_fusion``, ``cross_entropy_loss_fusion``); the
default is the unfused ops, which compute the same numbers up to the order of float roundings.
"""
