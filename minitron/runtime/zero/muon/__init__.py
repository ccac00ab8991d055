"""``deepspeed/runtime/zero/muon/``: the Muon optimizer (orthogonalised momentum for matrices,
Adam for the rest): its arithmetic in original_muon.py, the optimizer and the engine's tagging
in muon_optimizer.py. The names a ds_config may give are here, torch-free, so that reading a
config (runtime/basic_optimizer.py) does not import torch."""

# Which of the config's keys each half takes (DeepSpeed's _MUON_HALF_KEYS / _ADAM_HALF_KEYS)
MUON_KEYS = ("lr", "momentum", "weight_decay", "ns_method")
ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
# What the engine reads besides: the per-half lrs, the aux Adam's form, and per-head tagging
OTHER_KEYS = ("muon_lr", "adam_lr", "adam_w_mode", "torch_adam", "foreach", "fp32_optimizer_states",
              "per_head_muon")
NS_METHODS = ("gram", "standard")   # Newton-Schulz's two forms (original_muon.py)
