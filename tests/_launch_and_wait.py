"""Launch 4 forked ranks that sleep, for the Ctrl-C test: python tests/_launch_and_wait.py OUT."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _rank_probe import probe  # noqa: E402
from minitron.launcher import LaunchConfig, Target, launch  # noqa: E402

out = Path(sys.argv[1])
# warm=(): the sleeping ranks never reach an optimizer, so torch._dynamo (the default warm-up,
# ~1.7 s of CPU in this fresh interpreter) would be imported for nothing.
launch(LaunchConfig(world_size=4, log_dir=out / "logs", warm=()), Target(function=lambda: probe(out, "sleep")))
