"""treeflash's CLI with the hand-written norm kernel turned off (Inductor's norms, as before): an A/B in one call."""
import runpy
import sys

from treeflash.models.kernels import Kernels

Kernels._norm_kernel = lambda self, x: False
sys.argv = ["treeflash"] + sys.argv[1:]
runpy.run_module("treeflash.cli", run_name="__main__")
