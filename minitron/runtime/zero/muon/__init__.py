"""``deepspeed/runtime/zero/muon/``: the Muon optimizer (orthogonalised momentum for matrices,
Adam for the rest): its arithmetic in original_muon.py, the optimizer and the engine's tagging
in muon_optimizer.py."""
