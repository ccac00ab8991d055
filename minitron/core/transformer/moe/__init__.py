"""Mixture of experts: router, all-to-all token dispatcher, experts (Megatron's moe/ package)."""
