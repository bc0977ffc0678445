"""`treeflash bench --synthetic` with the norms interleaved: variant compiled/16/splitkv runs the hand-written
Triton norm (models/norm_kernel.py), compiled/17/splitkv Inductor's (N, FlexAttention's decoding reach, is
unused by the splitkv backend, so it only labels the norm choice here). One process, same weights."""
import runpy
import sys

import treeflash.bench.synthetic as synthetic
from treeflash.models.kernels import Kernels

hand = [True]
_norm_kernel = Kernels._norm_kernel
Kernels._norm_kernel = lambda self, x: hand[0] and _norm_kernel(self, x)
_options = synthetic.Variant.engine_options


def engine_options(self):
    hand[0] = self.flex_decode_tokens != 17  # set before each (batch, method, variant) builds its engine
    return _options(self)


synthetic.Variant.engine_options = engine_options
sys.argv = ["treeflash"] + sys.argv[1:]
runpy.run_module("treeflash.cli", run_name="__main__")
