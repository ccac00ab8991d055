"""All forwards, then all backwards (GPipe's order), run for real to compare with 1F1B.

Megatron has no such schedule, and minitron's schedules follow Megatron's. So chapter 11 writes
it here: the 1F1B function (minitron/core/pipeline_parallel/schedules.py) with its warm-up
stretched over every micro-batch, which leaves no steady state: each stage runs all its
forwards, receiving and sending activations, then all its backwards. It calls the same traced
``forward_step``, ``backward_step`` and point-to-point functions, so its trace is read and
drawn exactly like the real schedules'.

    python docs/examples/afab_schedule.py OUT_DIR [--pp 4]

traces two iterations of the same tiny GPT that `minitron trace --world P --pp P --steps 2` runs
into OUT_DIR and prints the executed order of the second (the first pays one-time costs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def forward_backward_all_forward_all_backward(*, forward_step_func, data_iterator, model, num_microbatches,
                                               seq_length, micro_batch_size, forward_only=False, **_):
    from minitron.core.pipeline_parallel import p2p_communication as p2p
    from minitron.core.pipeline_parallel import schedules as s

    model = model[0] if isinstance(model, list) else model
    data_iterator = data_iterator[0] if isinstance(data_iterator, list) else data_iterator
    config = s.get_model_config(model)
    shape = s.get_tensor_shape(config, seq_length, micro_batch_size)
    inputs, outputs, losses = [], [], []
    total_num_tokens = 0   # the loss tokens, for --calculate-per-token-loss
    no_sync = s._no_sync(config)
    no_sync.__enter__()  # the data-parallel reduction waits for the last backward, as in 1F1B
    for mb in range(num_microbatches):  # every forward: all activations stay alive
        input_tensor = p2p.recv_forward(shape, config)
        output_tensor, num_tokens = s.forward_step(forward_step_func, data_iterator, model, num_microbatches,
                                                   input_tensor, losses, config, current_microbatch=mb)
        total_num_tokens = total_num_tokens + num_tokens
        p2p.send_forward(output_tensor, config)
        inputs.append(input_tensor)
        outputs.append(output_tensor)
        s.deallocate_output_tensor(output_tensor, getattr(config, "deallocate_pipeline_outputs", True))
    for mb in range(num_microbatches):  # then every backward, in the same order
        if mb == num_microbatches - 1:
            no_sync.__exit__(None, None, None)
        output_grad = p2p.recv_backward(shape, config)
        input_grad = s.backward_step(inputs.pop(0), outputs.pop(0), output_grad, config, current_microbatch=mb)
        p2p.send_backward(input_grad, config)
    s._finalize(config, [model], forward_only, total_num_tokens)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--pp", type=int, default=4)
    opts = parser.parse_args()

    from rich.console import Console

    from minitron.cli.trace import pretrain_argv, training_argv
    from minitron.cli.views.schedule import pipeline_steps, render_slots
    from minitron.trace.reader import load_trace
    from minitron.launcher import LaunchConfig, Target, launch, session_env
    from minitron.training import training

    # The ranks are forked from this process, so they inherit the schedule set here.
    training.get_forward_backward_func = lambda: forward_backward_all_forward_all_backward
    argv = pretrain_argv(1, opts.pp, 1, 1, None, "tp-cp-ep-dp-pp", "gloo", training_argv(opts.pp, 1, opts.pp, 1, 2))
    opts.out.mkdir(parents=True, exist_ok=True)
    for stale in opts.out.glob("rank*.jsonl"):
        stale.unlink()
    cfg = LaunchConfig(world_size=opts.pp, backend="gloo", log_dir=opts.out / "logs",
                       env=session_env(opts.pp, opts.out))
    launch(cfg, Target(module="minitron.pretrain_gpt", argv=argv))
    print("all forwards, then all backwards: iteration 1, tensor rank 0, data rank 0")
    console = Console()
    console.print(render_slots(pipeline_steps(load_trace(opts.out), iteration=1), width=console.width))


if __name__ == "__main__":
    sys.exit(main())
