"""treeflash: lossless speculative decoding with DFlash drafters and DDTree draft trees."""

from treeflash.llm import LLM
from treeflash.outputs import RequestMetrics, RequestOutput
from treeflash.sampling import SamplingParams

__all__ = ["LLM", "RequestMetrics", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
