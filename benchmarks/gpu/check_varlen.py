"""Does packed varlen attention match the per-request SDPA loop on this GPU, and would the check
catch a wrong mask? Prints the relative logit error of the causal (bottom-right) window and of a
deliberately wrong, non-causal one, for a random-weight architecture at bf16.

    python benchmarks/gpu/check_varlen.py ARCH
"""

import functools
import sys

import torch.nn.attention.varlen as V

from wispsim.engines import hf
from wispsim.engines.base import EngineSpec
from wispsim.model.archs import load_arch

arch = load_arch(sys.argv[1] if len(sys.argv) > 1 else "llama-2-7b")
device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
spec = EngineSpec(arch_config=arch.hf, model_path=None, device=device, dtype="bfloat16", attention="loop")
engine = hf.HFEngine.build(spec)  # built on the loop method: the varlen build runs the check itself
engine.attention = "varlen" if device == "cuda" else "loop"
print("causal window:", hf.check_packed_attention(engine, reference="loop", tol=1.0))
print("per-request reference:", hf.check_packed_attention(engine, reference="per-request", tol=1.0))
real = V.varlen_attn


@functools.wraps(real)
def wrong(*a, **k):
    return real(*a, **{**k, "window_size": (-1, -1)})


V.varlen_attn = wrong
print("wrong (non-causal) window:", hf.check_packed_attention(engine, reference="loop", tol=1.0))
