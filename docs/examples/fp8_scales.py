"""fp8's two formats, one cast, and a real run's scale history. Chapter 21 runs this.

    python docs/examples/fp8_scales.py formats    # e4m3 and e5m2 side by side, one tensor cast
    python docs/examples/fp8_scales.py history    # pretrain's steps with --fp8-format hybrid
    python docs/examples/fp8_scales.py bytes      # what minitron estimate counts for fp8
    python docs/examples/fp8_scales.py mx         # one tensor, per-tensor scale against MXFP8 blocks
    python docs/examples/fp8_scales.py experts    # an MoE GPT's experts in fp8: rows, padding, scales

``history`` runs pretrain_gpt's own setup and train_step on one forked gloo rank (the
launcher's API, as the tests run it): a small GPT on mock data, --fp8-format hybrid with the
delayed recipe, an amax history of 4 and --fp8-amax-compute-algo max. After every iteration it
reads the first layer's linear_fc1 slots (core/fp8_utils.py keeps them on the layer): the
amax each slot saw and the scale it cast with, and for the output gradient (e5m2) how many of
its non-zero values the cast turned into zero.
"""

from __future__ import annotations

import sys

import torch

TRAIN = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "4", "--global-batch-size", "4", "--train-iters", "8", "--lr", "1e-2",
         "--lr-warmup-iters", "0", "--min-lr", "1e-2", "--mock-data", "--vocab-size", "1023", "--seed", "7",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--distributed-backend", "gloo", "--bf16",
         "--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "4",
         "--fp8-amax-compute-algo", "max"]


def formats() -> None:
    from minitron.core.fp8.recipes import FORMATS, current_scale, dequantize, quantize

    print(f"{'format':<6} {'bits (exp, mantissa)':>20} {'largest':>8} {'smallest normal':>16} "
          f"{'smallest subnormal':>19} {'step after 1':>13}")
    for name, (dtype, fp8_max) in FORMATS.items():
        info = torch.finfo(dtype)
        bits = (4, 3) if name == "e4m3" else (5, 2)
        subnormal = info.smallest_normal * 2.0 ** -bits[1]
        print(f"{name:<6} {str(bits):>20} {fp8_max:>8g} {info.smallest_normal:>16g} {subnormal:>19g} {info.eps:>13g}")
    x = torch.tensor([250.0, -1.7, 0.0123, 3.3e-4])
    scale = current_scale(x.abs().max(), "e4m3")
    q = quantize(x, scale, "e4m3")
    back = dequantize(q, scale.reciprocal())
    print(f"\ncast to e4m3 with scale 448 / amax = 448 / {x.abs().max():g} = {float(scale):g}")
    print(f"{'x':>10} {'x * scale':>11} {'e4m3 value':>11} {'back (/ scale)':>15} {'relative error':>15}")
    for xi, qi, bi in zip(x.tolist(), q.float().tolist(), back.tolist()):
        print(f"{xi:>10g} {xi * float(scale):>11.4g} {qi:>11g} {bi:>15.4g} {abs(bi - xi) / abs(xi):>15.2%}")


def _spy(slot, log):
    """Wrap one slot's quantize: remember its amax, the scale it cast with, the share of its
    non-zero values cast to zero, and how many values it clipped at the format's largest."""
    from minitron.core.fp8.recipes import FORMATS
    cast, fp8_max = slot.quantize, FORMATS[slot.fmt][1]

    def quantize(x, group=None):
        q, inv = cast(x, group)
        lost = ((q.float() == 0) & (x != 0)).sum().item() / max((x != 0).sum().item(), 1)
        clipped = (x.float().abs() / inv > fp8_max).sum().item()
        log.append((x.detach().abs().max().item(), 1.0 / inv.item(), lost, clipped))
        return q, inv
    slot.quantize = quantize


def history() -> list:
    def body(rank):
        from minitron.core.fp8_utils import ROLES, fp8_quantizers, get_fp8_context
        from minitron.training.arguments import core_transformer_config_from_args
        from minitron.pretrain_gpt import ARGS_DEFAULTS, forward_step, model_provider, train_valid_test_datasets_provider
        from minitron.training.data import build_train_valid_test_data_iterators
        from minitron.training.global_vars import get_args
        from minitron.training.initialize import initialize_megatron
        from minitron.training.model_setup import setup_model_and_optimizer
        from minitron.training.training import train_step

        initialize_megatron(args_defaults=ARGS_DEFAULTS, argv=TRAIN)
        model, optimizer, scheduler = setup_model_and_optimizer(model_provider, "encoder_or_decoder")
        train_iter, _, _ = build_train_valid_test_data_iterators(train_valid_test_datasets_provider)
        fc1 = next(m for name, m in model[0].named_modules() if name.endswith("layers.0.mlp.linear_fc1"))
        with get_fp8_context(core_transformer_config_from_args(get_args())):
            slots = fp8_quantizers(fc1)   # made now rather than in the first forward, to be watched
        logs = {role: [] for role in ROLES}
        for role in ROLES:
            _spy(slots[role], logs[role])
        logs["loss"] = []
        for iteration in range(get_args().train_iters):
            get_args().curr_iteration = iteration
            loss = train_step(forward_step, train_iter, model, optimizer, scheduler)[0]["lm loss"]
            logs["loss"].append(float(loss))
        return logs

    from minitron.launcher import LaunchConfig, run_on_ranks
    return run_on_ranks(body, LaunchConfig(world_size=1))[0]


def bytes_per_rank() -> None:
    """Activations and fp8 state of one rank, bf16 against fp8, from `minitron estimate`'s own
    functions (theoretical_memory_usage.py with theoretical_fp8.py's terms)."""
    from minitron.cli.common import validate_pretrain
    from minitron.training.theoretical_memory_usage import report_theoretical_memory
    from minitron.training.tokenizer import build_tokenizer

    print(f"{'hidden':>6} {'layers':>6} {'micro-batch':>11} | {'bf16 activations':>16} | {'fp8 activations':>15} "
          f"{'change':>7} {'fp8 state':>9}   (seq 2048, tp 1, GPT-2 vocabulary, history 1024)")
    for h, layers, mbs in ((1024, 8, 1), (4096, 8, 1), (4096, 8, 8)):
        model = ["--num-layers", str(layers), "--hidden-size", str(h), "--num-attention-heads", str(h // 64),
                 "--seq-length", "2048", "--micro-batch-size", str(mbs), "--train-iters", "1", "--lr", "1e-4",
                 "--mock-data", "--vocab-size", "50257", "--bf16", "--attention-dropout", "0", "--hidden-dropout", "0"]
        cost = []
        for fp8 in ([], ["--fp8-format", "hybrid", "--fp8-amax-history-len", "1024"]):
            args = validate_pretrain(model + fp8, 1)
            build_tokenizer(args)
            cost.append(report_theoretical_memory(args)[0].memory)
        a, b = cost[0]["activations"], cost[1]["activations"]
        print(f"{h:>6} {layers:>6} {mbs:>11} | {a / 2**20:>12.1f} MiB | {b / 2**20:>11.1f} MiB {b / a - 1:>7.1%} "
              f"{cost[1]['fp8_state'] / 2**10:>5.0f} KiB")


def mx() -> None:
    """64 values in two blocks five orders of magnitude apart, cast to e4m3 with one scale for
    the tensor (tensorwise) and with a power of two per 32 (mxfp8)."""
    from minitron.core.fp8.recipes import current_scale, dequantize, mx_quantize, quantize

    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, generator=g)
    x[:32] *= 100.0
    x[32:] *= 1e-3
    tensor_scale = current_scale(x.abs().max(), "e4m3")
    per_tensor = dequantize(quantize(x, tensor_scale, "e4m3"), tensor_scale.reciprocal())
    q, exponents = mx_quantize(x.unsqueeze(0), "e4m3", dim=1)
    blocks = dequantize(q, exponents).squeeze(0)
    print(f"tensorwise: one scale, 448 / {x.abs().max():.4g} = {float(tensor_scale):.4g}")
    print(f"mxfp8: one power of two per 32 elements, 2^{(exponents.int() - 127).tolist()[0]}\n")
    print(f"{'elements':>8} {'amax':>9} | {'tensorwise: zeros':>17} {'mean rel. error':>15} | "
          f"{'mxfp8: zeros':>12} {'mean rel. error':>15}")
    for lo in (0, 32):
        part = slice(lo, lo + 32)
        row = [f"{lo}-{lo + 31}", f"{x[part].abs().max():.3g}"]
        for back in (per_tensor, blocks):
            err = ((back[part] - x[part]).abs() / x[part].abs()).mean()
            row += [int((back[part] == 0).sum()), f"{err:.2%}"]
        print(f"{row[0]:>8} {row[1]:>9} | {row[2]:>17} {row[3]:>15} | {row[4]:>12} {row[5]:>15}")


def experts() -> None:
    """A small MoE GPT (2 layers, h 64, 4 experts, top-2: each step routes 128 tokens x 2) takes
    3 Adam steps on one batch on one forked gloo rank, --fp8-format hybrid, delayed recipe, amax
    history 4, "max". For the first layer's experts, each step: the rows routed to the expert,
    the rows fc1 multiplies (padded to 16s), the amax of its fc1 input and the scale it cast
    with, the expert's own."""
    def body(rank):
        from minitron.core import parallel_state as ps
        from minitron.core.fp8_utils import get_fp8_context, fp8_quantizers
        from minitron.core.models.gpt import GPTModel
        from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
        from minitron.core.transformer.transformer_config import TransformerConfig

        ps.initialize_model_parallel(1, 1)
        config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, hidden_dropout=0.0,
                                   attention_dropout=0.0, num_moe_experts=4, moe_router_topk=2, init_seed=3,
                                   fp8="hybrid", fp8_recipe="delayed", fp8_amax_history_len=4,
                                   fp8_amax_compute_algo="max")
        model_parallel_cuda_manual_seed(5)
        model = GPTModel(config, 256, 32)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
        log = []
        for e, expert in enumerate(model.decoder.layers[0].mlp.experts.local_experts):
            with get_fp8_context(config):
                slot = fp8_quantizers(expert.linear_fc1)["input"]   # made now, to be watched
            forward, cast = expert.forward, slot.quantize

            def routed(x, forward=forward, e=e):
                log.append([e, x.size(0)])
                return forward(x)

            def quantize(x, group=None, cast=cast):
                q, inv = cast(x, group)
                log[-1] += [x.size(0), x.abs().max().item(), 1.0 / inv.item()]
                return q, inv
            expert.forward, slot.quantize = routed, quantize
        for step in range(3):
            loss = model(ids, torch.arange(32).expand(4, 32), labels=ids.roll(1, 1)).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return log

    from minitron.launcher import LaunchConfig, run_on_ranks
    log = run_on_ranks(body, LaunchConfig(world_size=1))[0]
    print(f"{'step':>4} {'expert':>6} {'rows routed':>11} {'rows in fp8':>11} {'fc1 input amax':>14} "
          f"{'scale cast with':>15}")
    for i, (e, rows, padded, amax, scale) in enumerate(log):
        print(f"{i // 4 + 1:>4} {e:>6} {rows:>11} {padded:>11} {amax:>14.4f} {scale:>15.2f}")
    # the lines the chapter reads the table by: step 2 casts with 448 / each expert's own step-1 amax
    first, second = log[:4], log[4:8]
    print("\nstep 2 casts each expert's input with 448 / its own step-1 amax:")
    for (e, _, _, amax, _), (_, _, _, _, scale) in zip(first, second):
        print(f"  expert {e}: 448 / {amax:.4f} = {scale:.2f}")


def main() -> None:
    if sys.argv[1:] == ["mx"]:
        return mx()
    if sys.argv[1:] == ["experts"]:
        return experts()
    if sys.argv[1:] == ["formats"]:
        return formats()
    if sys.argv[1:] == ["bytes"]:
        return bytes_per_rank()
    logs = history()
    print("layer 1's linear_fc1 under --fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 4 "
          "--fp8-amax-compute-algo max\n")
    print(f"{'iteration':>9} {'lm loss':>7} | {'input amax':>10} {'scale':>6} {'clipped':>7} | "
          f"{'weight amax':>11} {'scale':>5} {'clipped':>7} | {'grad amax':>9} {'scale (e5m2)':>12} {'to 0':>5} {'clipped':>7}")
    for i, loss in enumerate(logs["loss"]):
        (xa, xs, _, xc), (wa, ws, _, wc), (ga, gs, lost, gc) = (logs[r][i] for r in ("input", "weight", "grad_output"))
        print(f"{i + 1:>9} {loss:>7.4f} | {xa:>10.4g} {xs:>6.4g} {xc:>7} | {wa:>11.4g} {ws:>5.0f} {wc:>7} | "
              f"{ga:>9.3g} {gs:>12.5g} {lost:>5.1%} {gc:>7}")
    _worked_out(logs)


def _worked_out(logs) -> None:
    """The lines the chapter reads the table by, computed from it."""
    amax = [x[0] for x in logs["input"]]
    last = len(amax) - 1
    window = amax[max(0, last - 4):last]
    print(f"\niteration 1 casts with scale 1: {logs['grad_output'][0][2]:.1%} of the gradient's non-zero values "
          f"became zero")
    print(f"iteration {last + 1}'s input scale {logs['input'][last][1]:.4g} = 448 / {max(window):.4g}, the largest "
          f"input amax of iterations {last + 1 - len(window)}-{last}")
    for role, name in (("weight", "weight"), ("grad_output", "gradient")):
        rising = [i + 1 for i, x in enumerate(logs[role]) if x[3]]
        print(f"iterations whose {name} amax rose above its whole window, and so clipped values: {rising}")


if __name__ == "__main__":
    main()
