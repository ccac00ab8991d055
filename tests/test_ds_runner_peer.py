"""minitron's --include/--exclude held against DeepSpeed 0.19.8's own ``parse_inclusion_exclusion``
(the ``peer`` extra), on every case ``CASES`` builds: three hostfiles, each filter string as an
--include and as an --exclude, well-formed ones and the malformed ones a user types. Each side's
answer is the active resources, or "refused" for any exception (DeepSpeed raises ValueError or
IndexError, minitron its one-line ResourceError); the answers must be equal.

DeepSpeed runs in a child process, as the other peer tests keep it out of the tests' parent.
"""

import importlib
import json
from collections import OrderedDict

import pytest

from deepspeed_child import NEEDS_DEEPSPEED, answer_in_child

pytestmark = NEEDS_DEEPSPEED

POOLS = [{"worker-0": 4, "worker-1": 2}, {"localhost": 1}, {"b": 2, "a": 3, "c": 1}]


def _filters(pool: dict) -> list:
    hosts, first = list(pool), next(iter(pool))
    out = ["nohost", "nohost:0", ":0", "@", f"{first}:", f"{first}:0:1", f"{first}:0,,1", f"{first}: 1",
           f"{first}:-1", f"{first}:x", f"{first}@", f"@{first}"]
    for host, n in pool.items():
        out += [host, f"{host}:0", f"{host}:{n - 1}", f"{host}:{n}", f"{host}:0,0", f"{host}@{host}:0",
                f"{host}:{n - 1},0", f"{host}:" + ",".join(map(str, range(n)))]
    if len(hosts) > 1:
        out += ["@".join(hosts), "@".join(reversed(hosts)), f"{hosts[-1]}:0@{first}", f"{first}:0@{first}:1"]
    return out


CASES = [(pool, include, exclude) for pool in POOLS for spec in _filters(pool)
         for include, exclude in ((spec, ""), ("", spec))] + [(pool, "", "") for pool in POOLS]


def answers(module_name: str) -> list:
    parse = importlib.import_module(module_name).parse_inclusion_exclusion
    out = []
    for pool, include, exclude in CASES:
        try:
            # As (host, slots) pairs: the hosts' order decides the ranks, and dicts compare without it.
            out.append(list(parse(OrderedDict(pool), include, exclude).items()))
        except Exception:   # noqa: BLE001 -- any refusal counts as one; its words differ by design
            out.append("refused")
    return out


def test_inclusion_exclusion_equals_deepspeeds():
    theirs = answer_in_child("test_ds_runner_peer", "answers", "deepspeed.launcher.runner")
    ours = json.loads(json.dumps(answers("minitron.launcher.runner")))
    assert len(CASES) > 150
    differ = [(case, mine, ds) for case, mine, ds in zip(CASES, ours, theirs, strict=True) if mine != ds]
    assert not differ, differ[:5]
