"""Run a treeflash command with MANY_ROWS_WIDE_HEADS at one program per SM (fewer KV splits for many rows at
head_dim 128), for an A/B beside the same command as main has it: python3 one_per_sm.py -m MODULE ARGS..."""
import dataclasses
import runpy
import sys

import treeflash.splitkv_attention as kernels

kernels.MANY_ROWS_WIDE_HEADS = dataclasses.replace(kernels.MANY_ROWS_WIDE_HEADS, programs_per_sm=1)
sys.argv = [sys.argv[2]] + sys.argv[3:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
