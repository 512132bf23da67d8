"""The agent's side of the VTA-like accelerator: its native simulator, DRAM images, test programs.

The ISA and the artifact container are wire contracts in `protos.vta` and `protos.vta_program`;
the `vta_sim` backend (`device_agent/backends/vta_sim.py`) runs programs through `sim` and
`image`.
"""
