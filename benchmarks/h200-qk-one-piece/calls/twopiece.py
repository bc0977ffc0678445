"""Run a treeflash command with main's q/k path (per-head norms as two compiled pieces, q's and k's), for an A/B
beside the one-reduction piece of this branch: python3 twopiece.py -m MODULE ARGS..."""
import runpy
import sys

from treeflash.models.kernels import Kernels


def qk_norm_rotary(self, x, q_weight, k_weight, eps, cos, sin, q_heads):
    if q_weight is None:
        out = self.norm_rotary(x, None, eps, cos, sin)
        return out[:, :q_heads], out[:, q_heads:]
    return (self.norm_rotary(x[:, :, :q_heads], q_weight, eps, cos, sin),
            self.norm_rotary(x[:, :, q_heads:], k_weight, eps, cos, sin))


Kernels.qk_norm_rotary = qk_norm_rotary
sys.argv = [sys.argv[2]] + sys.argv[3:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
