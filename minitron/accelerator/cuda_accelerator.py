"""CUDA devices, NCCL collectives."""

import torch


class CUDA_Accelerator:
    _name = "cuda"
    _communication_backend_name = "nccl"

    def device_name(self, device_index=None) -> str:
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def communication_backend_name(self) -> str:
        return self._communication_backend_name

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def set_device(self, device_index: int) -> None:
        # One GPU per rank: LOCAL_RANK picks it, as Megatron does in _initialize_distributed.
        torch.cuda.set_device(device_index)

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}"

    def synchronize(self) -> None:
        # Before the rank's first CUDA call nothing is queued, and synchronizing would create a
        # context on GPU 0 before set_device has picked this rank's GPU.
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def manual_seed(self, seed: int) -> None:
        torch.cuda.manual_seed(seed)
