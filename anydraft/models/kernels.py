"""Linear layers on oneDNN with prepacked weights: a faster CPU path for the torch backend.

PyTorch's default CPU matrix product is slow exactly where speculative decoding lives, at a
few rows (a plain step scores 1 token, a verification 2 to 33): oneDNN with the weights
reordered once into its blocked layout runs the same product 1.4-3x faster on some CPUs
(docs/hardware.md has the measurements and machines). Whether it is faster here is measured
(`dtype="auto"`: models/auto.py), never assumed; ``dtype="float32+onednn"`` asks for it.

The weights are the same numbers in another layout; the products sum in another order, so
logits differ from the default kernels by float rounding (~1e-5 in float32). Greedy output is
identical to plain decoding in the same path, as with any kernel.
"""

from __future__ import annotations

import torch

SUFFIX = "+onednn"  # appended to a dtype name: its linear layers run here
# rows the packed layout is tuned for (oneDNN picks its blocking from it): a verification of
# about eight candidates, the range where the default kernels lose most; plain steps (1 row)
# lose little with it (docs/hardware.md)
PACK_ROWS = 8


def available(dtype: torch.dtype, device: str = "cpu") -> bool:
    """Whether oneDNN runs ``dtype`` linear layers on this machine (bfloat16 needs AVX-512 or
    AVX-NE-CONVERT)."""
    if not str(device).startswith("cpu") or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(torch.nn.Module):
    """``nn.Linear``'s forward on oneDNN, its weight reordered once. ``weight`` is a shape
    only (on the meta device): what reads it (the output layer's width) needs no numbers."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        weight = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()
        self.weight = torch.empty(weight.shape, dtype=weight.dtype, device="meta")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by a `PackedLinear`; return it.

    The other weights (embeddings, norms) are copied out of the loaded file's memory map, so
    that the map, which would otherwise keep every original weight's pages, is released:
    the packed model takes about the memory of the model it replaces."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PackedLinear(child))
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()
    return model
