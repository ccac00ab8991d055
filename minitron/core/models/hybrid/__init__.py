from minitron.core.models.hybrid.hybrid_model import HybridModel

__all__ = ["HybridModel"]
