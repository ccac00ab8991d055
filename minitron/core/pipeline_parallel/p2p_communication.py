"""Point-to-point traffic between neighbouring pipeline stages.

Forward, a stage sends its output activation to the next stage and receives its input from
the previous one; backward, the gradient of that activation travels the other way. Every
helper below is one call of ``_communicate``, which posts all its sends and receives at once
as non-blocking ops (``torch.distributed.batch_isend_irecv``) and waits for them.

Shapes are known in advance ([sequence, micro-batch, hidden], the same for every stage of a
GPT), so receivers allocate their buffers without a size handshake.
"""

from __future__ import annotations

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state as mpu


def _ops(tensor_send_next, tensor_send_prev, tensor_recv_prev, tensor_recv_next):
    """The P2P ops in an order both neighbours agree on.

    With two stages the previous and the next rank are the *same* peer, and messages between
    one pair of ranks are matched in the order they were posted. Even ranks therefore post
    "to next" before "to prev" and odd ranks "from prev" before "from next": each activation
    lands in the activation buffer and each gradient in the gradient buffer. (The same order
    also keeps blocking sends from deadlocking: one side always receives first.)
    """
    prev_rank = mpu.get_pipeline_model_parallel_prev_rank()
    next_rank = mpu.get_pipeline_model_parallel_next_rank()
    group = mpu.get_pipeline_model_parallel_group()
    P2POp = torch.distributed.P2POp
    send_next = tensor_send_next is not None and P2POp(torch.distributed.isend, tensor_send_next, next_rank, group)
    recv_prev = tensor_recv_prev is not None and P2POp(torch.distributed.irecv, tensor_recv_prev, prev_rank, group)
    send_prev = tensor_send_prev is not None and P2POp(torch.distributed.isend, tensor_send_prev, prev_rank, group)
    recv_next = tensor_recv_next is not None and P2POp(torch.distributed.irecv, tensor_recv_next, next_rank, group)
    if mpu.get_pipeline_model_parallel_rank() % 2 == 0:
        ordered = (send_next, recv_prev, send_prev, recv_next)
    else:
        ordered = (recv_prev, send_next, recv_next, send_prev)
    return [op for op in ordered if op]


def _communicate(*, tensor_send_next, tensor_send_prev, recv_prev: bool, recv_next: bool,
                 tensor_shape, config):
    """Send what is given, receive what is asked; return (tensor_recv_prev, tensor_recv_next)."""
    dtype = getattr(config, "pipeline_dtype", None) or torch.float32
    device = get_accelerator().current_device_name()   # NCCL receives into GPU memory only

    def buffer():
        # requires_grad: a received activation is the input of this stage's autograd graph,
        # and backward needs its .grad to send upstream.
        return torch.empty(tensor_shape, dtype=dtype, device=device, requires_grad=True)

    tensor_recv_prev = buffer() if recv_prev else None
    tensor_recv_next = buffer() if recv_next else None
    ops = _ops(tensor_send_next, tensor_send_prev, tensor_recv_prev, tensor_recv_next)
    if ops:
        for request in torch.distributed.batch_isend_irecv(ops):
            request.wait()
    return tensor_recv_prev, tensor_recv_next


def recv_forward(tensor_shape, config):
    """Input activation from the previous stage (None on the first stage: it reads data)."""
    if mpu.is_pipeline_first_stage():
        return None
    recv, _ = _communicate(tensor_send_next=None, tensor_send_prev=None, recv_prev=True, recv_next=False,
                           tensor_shape=tensor_shape, config=config)
    return recv


def recv_backward(tensor_shape, config):
    """Gradient of my output, from the next stage (None on the last stage: it has the loss)."""
    if mpu.is_pipeline_last_stage():
        return None
    _, recv = _communicate(tensor_send_next=None, tensor_send_prev=None, recv_prev=False, recv_next=True,
                           tensor_shape=tensor_shape, config=config)
    return recv


def send_forward(output_tensor, config):
    if not mpu.is_pipeline_last_stage():
        _communicate(tensor_send_next=output_tensor, tensor_send_prev=None, recv_prev=False, recv_next=False,
                     tensor_shape=None, config=config)


def send_backward(input_tensor_grad, config):
    if not mpu.is_pipeline_first_stage():
        _communicate(tensor_send_next=None, tensor_send_prev=input_tensor_grad, recv_prev=False, recv_next=False,
                     tensor_shape=None, config=config)


def send_forward_recv_backward(output_tensor, tensor_shape, config):
    """1F1B steady state: hand my output on and, in the same exchange, get its gradient back."""
    if mpu.is_pipeline_last_stage():
        return None
    _, grad = _communicate(tensor_send_next=output_tensor, tensor_send_prev=None, recv_prev=False,
                           recv_next=True, tensor_shape=tensor_shape, config=config)
    return grad


def send_backward_recv_forward(input_tensor_grad, tensor_shape, config):
    """1F1B steady state: send a gradient upstream and receive the next micro-batch's input."""
    if mpu.is_pipeline_first_stage():
        return None
    recv, _ = _communicate(tensor_send_next=None, tensor_send_prev=input_tensor_grad, recv_prev=True,
                           recv_next=False, tensor_shape=tensor_shape, config=config)
    return recv


# The interleaved schedule decides itself, per step, which directions carry a tensor (a model
# chunk's neighbour may be on this same pipeline rank's ring), so these take explicit flags.
def send_forward_recv_forward(output_tensor, recv_prev: bool, tensor_shape, config):
    recv, _ = _communicate(tensor_send_next=output_tensor, tensor_send_prev=None, recv_prev=recv_prev,
                           recv_next=False, tensor_shape=tensor_shape, config=config)
    return recv


def send_backward_recv_backward(input_tensor_grad, recv_next: bool, tensor_shape, config):
    _, recv = _communicate(tensor_send_next=None, tensor_send_prev=input_tensor_grad, recv_prev=False,
                           recv_next=recv_next, tensor_shape=tensor_shape, config=config)
    return recv


def send_forward_backward_recv_forward_backward(output_tensor, input_tensor_grad, recv_prev: bool,
                                                recv_next: bool, tensor_shape, config):
    return _communicate(tensor_send_next=output_tensor, tensor_send_prev=input_tensor_grad,
                        recv_prev=recv_prev, recv_next=recv_next, tensor_shape=tensor_shape, config=config)
