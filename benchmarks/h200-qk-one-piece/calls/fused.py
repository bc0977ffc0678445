"""Run a treeflash command or script with every splitkv launch merging in its last split (Launch.fused_merge),
for an A/B beside the same command without it: python3 fused.py (-m MODULE | SCRIPT) ARGS..."""
import dataclasses
import runpy
import sys

import treeflash.splitkv_attention as kernels

_launch_for = kernels.launch_for
kernels.launch_for = lambda head_dim, rows: dataclasses.replace(_launch_for(head_dim, rows), fused_merge=True)
if sys.argv[1] == "-m":
    sys.argv = [sys.argv[2]] + sys.argv[3:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
