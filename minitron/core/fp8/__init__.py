"""fp8 training as Transformer Engine's recipes define it: recipes.py (formats, casts, scales),
linear.py (a tensor-parallel linear's GEMMs with fp8 inputs). core/fp8_utils.py switches it on."""
