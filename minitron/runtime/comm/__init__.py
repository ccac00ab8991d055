"""DeepSpeed's ``runtime/comm``: collectives built from torch's, for ZeRO (coalesced_collectives.py)."""
