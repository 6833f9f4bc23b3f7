"""Linear layers on oneDNN with prepacked weights: a faster CPU path for the torch backend.

PyTorch's default CPU matrix product is slow exactly where speculative decoding lives, at a
few rows (a plain step scores 1 token, a verification 2 to 33): oneDNN with the weights
reordered once into its blocked layout runs the same product 1.4-3x faster on some CPUs
(docs/hardware.md has the measurements and machines). Whether it is faster here is measured
(`dtype="auto"`: hardware/profile.py), never assumed; ``dtype="float32+onednn"`` asks for it.

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
    """``nn.Linear``'s forward on oneDNN, its weight reordered once. ``weight`` stays the dense
    tensor when it is shared (tied embeddings) or read elsewhere (the output layer's width)."""

    def __init__(self, linear: torch.nn.Linear, keep_dense: bool):
        super().__init__()
        weight = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.weight = linear.weight if keep_dense else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by a `PackedLinear`; return it."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                packed = PackedLinear(child, keep_dense=child is output)
                setattr(module, name, packed)
    return model
