"""The flops profiler's report, in DeepSpeed's layout (its ``print_model_profile``): a summary of
the step, the top modules by class at each depth, and the model printed with each module's
params, MACs, latency and FLOPS beside it.

With the engine's timers on (``flops_profiler`` turns ``wall_clock_breakdown`` on, as in
DeepSpeed), the summary's latencies are the engine's ``fwd``/``bwd``/``step`` timers, and the
backward is credited with ``2 + recompute_fwd_factor`` forwards' FLOPs.
"""

from __future__ import annotations

import contextlib
import os
import sys

PRECISION = 2


def number_to_string(num: float) -> str:
    for magnitude, units in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if num >= magnitude:
            break
    else:
        magnitude, units = (1, "") if num >= 1 or num == 0 else (1e-3, "m") if num >= 1e-3 else (1e-6, "u")
    return f"{round(num / magnitude, PRECISION):g} {units}"


def params_to_string(n: float) -> str:
    return number_to_string(n).replace("G", "B").strip()


def module_flops(module) -> int:
    return sum(m.__flops__ for m in module.modules())


def module_macs(module) -> int:
    return sum(m.__macs__ for m in module.modules())


def module_duration(module) -> float:
    """A container that never runs forward itself (a ModuleList) takes its children's time."""
    return module.__duration__ or sum(module_duration(child) for child in module.children())


def print_model_profile(profiler, profile_step, module_depth, top_modules, detailed, output_file) -> None:
    out = open(output_file, "w") if output_file else None
    if output_file:
        os.makedirs(os.path.dirname(os.path.abspath(output_file)), exist_ok=True)
    with contextlib.redirect_stdout(out or sys.stdout):
        _summary(profiler, profile_step)
        print("\n----------------------------- Aggregated Profile per GPU -----------------------------")
        _aggregated(profiler.model, module_depth, top_modules)
        if detailed:
            print("\n------------------------------ Detailed Profile per GPU ------------------------------")
            print("Each module profile is listed after its name in the following order: \nparams, percentage of "
                  "total params, MACs, percentage of total MACs, fwd latency, percentage of total fwd latency, "
                  "fwd FLOPS")
            print("\nNote: a module's counts include its submodules' and the functions it calls itself (a loss "
                  "computed in forward, say), so a parent's MACs or latency may exceed the sum of its children's. "
                  "The FLOPs come from formulas, not a hardware counter, so a FLOPS figure can exceed what the "
                  "device can do; and the top module's latency is measured around its forward only, inside the "
                  "engine's fwd timer above.\n")
            _detailed(profiler)
        print("------------------------------------------------------------------------------")
    if out:
        out.close()


def _summary(profiler, profile_step) -> None:
    engine, flops, macs = profiler.ds_engine, profiler.get_total_flops(), profiler.get_total_macs()
    params, mp = profiler.get_total_params(), engine.mp_world_size if engine else 1
    line = "{:<70}  {:<8}".format
    print("\n-------------------------- DeepSpeed Flops Profiler --------------------------")
    print(f"Profile Summary at step {profile_step}:")
    print("Notations:\ndata parallel size (dp_size), model parallel size(mp_size),\nnumber of parameters (params), "
          "number of multiply-accumulate operations(MACs),\nnumber of floating-point operations (flops), "
          "floating-point operations per second (FLOPS),\nfwd latency (forward propagation latency), bwd latency "
          "(backward propagation latency),\nstep (weights update latency), iter latency (sum of fwd, bwd and step "
          "latency)\n")
    if engine:
        print(line("world size: ", engine.world_size))
        print(line("data parallel size: ", engine.dp_world_size))
        print(line("model parallel size: ", mp))
        print(line("batch size per GPU: ", engine.train_micro_batch_size_per_gpu()))
    print(line("params per GPU: ", params_to_string(params)))
    print(line("params of model = params per GPU * mp_size: ", params_to_string(params * mp)))
    print(line("fwd MACs per GPU: ", number_to_string(macs) + "MACs"))
    print(line("fwd flops per GPU: ", number_to_string(flops)))
    print(line("fwd flops of model = fwd flops per GPU * mp_size: ", number_to_string(flops * mp)))
    timed = engine is not None and engine._config.wall_clock_breakdown
    fwd = engine.timers("fwd").elapsed(reset=False) / 1000 if timed else profiler.get_total_duration()
    print(line("fwd latency: ", number_to_string(fwd) + "s"))
    print(line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", number_to_string(flops / fwd) + "FLOPS"))
    if not timed:
        return
    factor = 2 + profiler.recompute_fwd_factor
    bwd, step = (engine.timers(name).elapsed(reset=False) / 1000 for name in ("bwd", "step"))
    print(line("bwd latency: ", number_to_string(bwd) + "s"))
    print(line(f"bwd FLOPS per GPU = {factor:g} * fwd flops per GPU / bwd latency: ",
               number_to_string(factor * flops / bwd) + "FLOPS"))
    print(line(f"fwd+bwd FLOPS per GPU = {factor + 1:g} * fwd flops per GPU / (fwd+bwd latency): ",
               number_to_string((factor + 1) * flops / (fwd + bwd)) + "FLOPS"))
    print(line("step latency: ", number_to_string(step) + "s"))
    print(line("iter latency: ", number_to_string(fwd + bwd + step) + "s"))
    print(line(f"FLOPS per GPU = {factor + 1:g} * fwd flops per GPU / iter latency: ",
               number_to_string((factor + 1) * flops / (fwd + bwd + step)) + "FLOPS"))
    samples = engine.train_micro_batch_size_per_gpu() * engine.world_size
    print(line("samples/second: ", round(samples / (fwd + bwd + step), PRECISION)))


def _aggregated(model, module_depth: int, top_modules: int) -> None:
    """Per depth, each module class's MACs, params and latency summed, the top ones of each."""
    info: dict = {}

    def walk(module, depth):
        row = info.setdefault(depth, {}).setdefault(type(module).__name__, [0, 0, 0.0])
        row[0] += module_macs(module)
        row[1] += module.__params__
        row[2] += module_duration(module)
        for child in module.children():
            walk(child, depth + 1)

    walk(model, 0)
    depth = len(info) - 1 if module_depth == -1 else module_depth
    print(f"Top {top_modules} modules in terms of params, MACs or fwd latency at different model depths:")
    for d in range(depth):
        def top(k, show):
            ranked = sorted(info[d].items(), key=lambda item: item[1][k], reverse=True)[:top_modules]
            return {name: show(values[k]) for name, values in ranked}
        print(f"depth {d}:")
        print(f"    params      - {top(1, params_to_string)}")
        print(f"    MACs        - {top(0, lambda v: number_to_string(v) + 'MACs')}")
        print(f"    fwd latency - {top(2, lambda v: number_to_string(v) + 's')}")


def _detailed(profiler) -> None:
    """The model's own repr, each module's extra_repr led by its profile for the printing."""
    params, macs, duration = profiler.get_total_params(), profiler.get_total_macs(), profiler.get_total_duration()

    def percent(part, whole):
        return round(100 * part / whole, PRECISION) if whole else 0

    def profiled(module):
        own, m_macs, m_time = module.__params__, module_macs(module), module_duration(module)
        items = [f"{params_to_string(own)} = {percent(own, params):g}% Params",
                 f"{number_to_string(m_macs)}MACs = {percent(m_macs, macs):g}% MACs",
                 f"{number_to_string(m_time)}s = {percent(m_time, duration):g}% latency",
                 number_to_string(round(module_flops(module) / m_time, PRECISION) if m_time else 0) + "FLOPS"]
        return ", ".join(items + ([module.extra_repr()] if module.extra_repr() else []))

    texts = {module: profiled(module) for module in profiler.model.modules()}
    for module, text in texts.items():   # an instance attribute shadows the class's method for repr
        module.extra_repr = lambda text=text: text
    try:
        print(profiler.model)
    finally:
        for module in texts:
            del module.extra_repr
