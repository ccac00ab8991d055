"""finalize_model_grads on 4 gloo ranks with tp=2, pp=2 (dp=1): the tied embedding's gradient
is summed over the first and last stage, sequence-parallel parameters over the TP group, and
a per-token loss divides every gradient by the global token count."""

from types import SimpleNamespace

import torch

from distributed import run_ranks


class _Stage(torch.nn.Module):
    """A pipeline stage with Megatron's tied-embedding interface and one sequence-parallel norm."""

    def __init__(self, pre_process: bool, post_process: bool):
        super().__init__()
        self.pre_process, self.post_process = pre_process, post_process
        self.share_embeddings_and_output_weights = True
        self.word_embeddings = torch.nn.Parameter(torch.zeros(5, 4))
        self.norm_weight = torch.nn.Parameter(torch.ones(4))
        self.norm_weight.sequence_parallel = True
        self.other = torch.nn.Parameter(torch.zeros(3))
        if pre_process:
            self.word_embeddings.shared_embedding = True
        else:
            self.word_embeddings.shared, self.word_embeddings.shared_embedding = True, True

    def shared_embedding_or_output_weight(self):
        return self.word_embeddings if (self.pre_process or self.post_process) else None


def _body(rank):
    from minitron.core import parallel_state as ps
    from minitron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from minitron.core.distributed.finalize_model_grads import finalize_model_grads
    config = SimpleNamespace(sequence_parallel=True, calculate_per_token_loss=True)
    stage = _Stage(ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage())
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), stage)

    def fill():
        stage.word_embeddings.main_grad.fill_(rank + 1)
        stage.norm_weight.main_grad.fill_(10 * (rank + 1))
        stage.other.main_grad.fill_(rank)

    fill()
    finalize_model_grads([ddp])
    out = {"word": stage.word_embeddings.main_grad[0, 0].item(),
           "norm": stage.norm_weight.main_grad[0].item(),
           "other": stage.other.main_grad[0].item()}

    # Sequence parallel off: the norm's gradient is whole on every rank and stays as it is.
    config.sequence_parallel = False
    fill()
    finalize_model_grads([ddp])
    out["norm_no_sp"] = stage.norm_weight.main_grad[0].item()

    # Per-token loss: only the last stage knows the count (8 tokens); everyone divides by it.
    fill()
    count = torch.tensor([8.0 if ps.is_pipeline_last_stage() else 0.0])
    finalize_model_grads([ddp], num_tokens=count)
    out["other_per_token"] = stage.other.main_grad[0].item()
    return out


def test_finalize_model_grads_tp2_pp2():
    results = run_ranks(_body, world_size=4, tp=2, pp=2)
    # Layout (order tp-cp-ep-dp-pp): tp groups [0,1] [2,3]; pp (and embedding) groups [0,2] [1,3].
    assert [r["word"] for r in results] == [1 + 3, 2 + 4, 1 + 3, 2 + 4]
    assert [r["norm"] for r in results] == [10 + 20, 10 + 20, 30 + 40, 30 + 40]
    assert [r["other"] for r in results] == [0, 1, 2, 3]
    assert [r["norm_no_sp"] for r in results] == [10, 20, 30, 40]
    assert [r["other_per_token"] for r in results] == [0, 1 / 8, 2 / 8, 3 / 8]
