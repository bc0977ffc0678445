"""Run a treeflash command with the splitkv merge tile set: python3 merge_tile.py N -m MODULE ARGS..."""
import runpy
import sys

import treeflash.splitkv_attention as kernels

kernels.MERGE_TILE = int(sys.argv[1])
sys.argv = [sys.argv[3]] + sys.argv[4:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
