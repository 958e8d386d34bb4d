"""The real agent process (`llmgw agent`), with a fake NVML of one H100 SXM (or A100 SXM) in place of the driver.

    python tests/fakes/agent_with_fake_nvml.py --config agent.yaml [--no-permission] [--a100]

Everything but NVML is the agent's own: its config, heartbeat loop, HTTP client and sensor reader.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents.node.daemon import machine_root, main  # noqa: E402
from agents.node.sensors import SensorReader  # noqa: E402
from tests.fakes.fake_nvml import a100_sxm, fake_nvml, h100_sxm  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    gpu = h100_sxm(0)
    if "--a100" in argv:  # an A100 SXM in place of the H100
        argv.remove("--a100")
        gpu = a100_sxm(0)
    if "--no-permission" in argv:
        argv.remove("--no-permission")
        gpu.privileged = False
    nvml = fake_nvml([gpu])
    sys.exit(main(argv, reader_factory=lambda root: SensorReader(sys_root=machine_root(root), nvml=nvml)))
