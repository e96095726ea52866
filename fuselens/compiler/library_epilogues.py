"""Pointwise epilogues that run inside a library matmul call (Triton target).

Neither code generator has a matmul template, so `F.linear` stays a library call
(cuBLAS on the GPU) and the activation after it would be its own kernel: one more
full read and write of the matmul's output (GPT-2's MLP: a 16x1024x3072 bfloat16
tensor, 200 MB of traffic). cuBLASLt can apply a bias and then GELU or ReLU to its
float32 accumulator before the store; torch exposes that as
`torch._addmm_activation(bias, x, w.t(), use_gelu=...)`. This pass, run on
Dynamo's graph before AOTAutograd, rewrites

    gelu(linear(x, w, b), approximate="tanh")  ->  one _addmm_activation call
    relu(linear(x, w, b))                      ->  one _addmm_activation call

and, for convolutions, folds an inference batch norm into the convolution's weight
and bias (two tiny kernels over the weights, compiled like any other pointwise work)
so that cuDNN's fused convolution runs bias, the residual add and ReLU in its
epilogue (ResNet's conv-bn-relu and conv-bn-add-relu):

    relu(batch_norm(conv2d(x, w), training=False) [+ z])  ->  one fuselens::conv2d_bias_relu

Only when nothing needs a gradient (`_addmm_activation` has no derivative), only
a 1-D bias, and the linear's output must have no other reader. GELU only in its
tanh form and only on CUDA tensors: cuBLASLt's GELU epilogue (and ATen's CUDA
fallback for it) is the tanh approximation, while ATen's CPU kernel applies the
erf form; the erf form stays a fused Triton kernel. The C++ target keeps its own
fused bias+activation kernel (faster on CPU than ATen's addmm followed by an
in-place activation).
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence

import torch
import torch.fx

_LINEAR = {torch._C._nn.linear, torch.nn.functional.linear}
_GELU = {torch._C._nn.gelu, torch.nn.functional.gelu}
_RELU = {torch.relu, torch.nn.functional.relu}
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_CONV2D = {torch.conv2d, torch.nn.functional.conv2d}
_BATCH_NORM = {torch.nn.functional.batch_norm}  # (input, running_mean, running_var, weight, bias, training, ..., eps)
_ADD = {operator.add, torch.add}


def conv2d_bias_relu_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, z: Optional[torch.Tensor],
                          stride: list[int], padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    """relu(conv2d(x, weight, bias) + z) as one cuDNN call (ATen's ops where cuDNN is off or absent).
    Generated wrappers call this directly: the custom op's dispatch costs ~10 us a call."""
    if x.is_cuda and torch.version.hip is None and torch.backends.cudnn.enabled:
        # the torch.* bindings: an OpOverloadPacket call parses the schema each time (~10 us)
        if z is None:
            return torch.cudnn_convolution_relu(x, weight, bias, stride, padding, dilation, groups)
        return torch.cudnn_convolution_add_relu(x, weight, z, 1, bias, stride, padding, dilation, groups)
    y = torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return torch.relu(y if z is None else y + z)


@torch.library.custom_op("fuselens::conv2d_bias_relu", mutates_args=())
def conv2d_bias_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, z: Optional[torch.Tensor],
                     stride: list[int], padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    """The op AOTAutograd keeps whole (it has no decomposition) and fuselens lowers as a library call."""
    return conv2d_bias_relu_impl(x, weight, bias, z, stride, padding, dilation, groups)


@conv2d_bias_relu.register_fake
def _conv2d_bias_relu_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, z: Optional[torch.Tensor],
                           stride: list[int], padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    return torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)


def conv_bn_relu(x: torch.Tensor, weight: torch.Tensor, conv_bias: Optional[torch.Tensor], mean: torch.Tensor,
                 var: torch.Tensor, gamma: Optional[torch.Tensor], beta: Optional[torch.Tensor], eps: float,
                 z: Optional[torch.Tensor], stride: list[int], padding: list[int], dilation: list[int],
                 groups: int) -> torch.Tensor:
    """relu(batch_norm(conv2d(x, weight, conv_bias)) + z) with the batch norm folded in:
    bn(c) = (c - mean) * gamma / sqrt(var + eps) + beta is linear in c, so it becomes
    the convolution's weight scaled per output channel plus a bias."""
    scale = torch.rsqrt(var + eps)
    if gamma is not None:
        scale = scale * gamma
    bias = -mean * scale
    if conv_bias is not None:
        bias = bias + conv_bias * scale
    if beta is not None:
        bias = bias + beta
    w = weight * scale.reshape(-1, 1, 1, 1).to(weight.dtype)
    return conv2d_bias_relu(x, w, bias.to(x.dtype), z, stride, padding, dilation, groups)


def linear_activation(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, use_gelu: bool) -> torch.Tensor:
    """`act(F.linear(x, weight, bias))` as one cuBLASLt call with a bias+activation epilogue."""
    out = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=use_gelu)
    return out.view(*x.shape[:-1], weight.shape[0])


def _value(node: Any) -> Optional[torch.Tensor]:
    if not isinstance(node, torch.fx.Node):
        return None
    v = node.meta.get("example_value", node.meta.get("val"))
    return v if isinstance(v, torch.Tensor) else None


def _activation(node: torch.fx.Node) -> Optional[str]:
    if node.op != "call_function" or len(node.args) != 1:
        return None
    if node.target in _GELU and node.kwargs.get("approximate") == "tanh":
        return "gelu"
    if node.target in _RELU and not node.kwargs.get("inplace", False):
        return "relu"
    return None


def _linear_args(node: Any) -> Optional[tuple]:
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target not in _LINEAR:
        return None
    args = list(node.args) + [node.kwargs.get(k) for k in ("weight", "bias")[len(node.args) - 1:]]
    if len(args) != 3 or any(a is None for a in args):
        return None
    x, w, b = (_value(a) for a in args)
    if x is None or w is None or b is None:
        return None
    if x.dim() < 2 or w.dim() != 2 or b.dim() != 1 or x.dtype not in _FLOATS:
        return None
    if not (x.dtype == w.dtype == b.dtype) or not (x.device == w.device == b.device):
        return None
    out = _value(node)
    if out is None or out.dtype != x.dtype:  # autocast changes the matmul's dtype: leave it to ATen
        return None
    return tuple(args)


def use_library_epilogues(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> int:
    """Rewrite `gm` in place (see the module docstring); returns how many patterns
    were rewritten (the fusion events name them, from the library calls' targets)."""
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs):
        return 0
    done = 0
    for act in list(gm.graph.nodes):
        kind = _activation(act)
        if kind is None:
            continue
        lin = act.args[0]
        args = _linear_args(lin)
        if args is None or len(lin.users) != 1:
            continue
        if kind == "gelu" and _value(lin).device.type != "cuda":
            continue
        with gm.graph.inserting_before(act):
            new = gm.graph.call_function(linear_activation, (*args, kind == "gelu"))
        new.meta = dict(act.meta)
        act.replace_all_uses_with(new)
        gm.graph.erase_node(act)
        gm.graph.erase_node(lin)
        done += 1
    done += _fold_conv_bn_relu(gm)
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _arg(node: torch.fx.Node, i: int, name: str, default: Any) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _pair(v: Any) -> Optional[list[int]]:
    if isinstance(v, int):
        return [v, v]
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return list(v)
    return None


def _fold_conv_bn_relu(gm: torch.fx.GraphModule) -> int:
    done = 0
    for relu in list(gm.graph.nodes):
        if relu.op != "call_function" or relu.target not in _RELU or relu.kwargs.get("inplace", False):
            continue
        src, z, add = relu.args[0], None, None
        if isinstance(src, torch.fx.Node) and src.op == "call_function" and src.target in _ADD \
                and len(src.args) == 2 and not src.kwargs and len(src.users) == 1:
            add = src
            for i in (0, 1):
                a, other = add.args[i], add.args[1 - i]
                if isinstance(a, torch.fx.Node) and a.target in _BATCH_NORM:
                    src, z = a, other
                    break
        bn = src
        if not isinstance(bn, torch.fx.Node) or bn.op != "call_function" or bn.target not in _BATCH_NORM \
                or len(bn.users) != 1 or _arg(bn, 5, "training", True) is not False:
            continue
        conv = bn.args[0]
        if not isinstance(conv, torch.fx.Node) or conv.op != "call_function" or conv.target not in _CONV2D \
                or len(conv.users) != 1:
            continue
        x, w = _value(_arg(conv, 0, "input", None)), _value(_arg(conv, 1, "weight", None))
        out = _value(bn)
        stride, padding = _pair(_arg(conv, 3, "stride", 1)), _pair(_arg(conv, 4, "padding", 0))
        dilation, groups = _pair(_arg(conv, 5, "dilation", 1)), _arg(conv, 6, "groups", 1)
        mean, var = _arg(bn, 1, "running_mean", None), _arg(bn, 2, "running_var", None)
        if x is None or w is None or out is None or x.dim() != 4 or x.dtype not in _FLOATS or w.dtype != x.dtype:
            continue
        if _value(conv) is None or _value(conv).dtype != x.dtype or out.dtype != x.dtype:  # autocast
            continue
        if None in (stride, padding, dilation) or not isinstance(groups, int) or _value(mean) is None \
                or _value(var) is None:
            continue
        if z is not None and (_value(z) is None or _value(z).shape != out.shape or _value(z).dtype != out.dtype):
            continue
        args = (_arg(conv, 0, "input", None), _arg(conv, 1, "weight", None),
                _arg(conv, 2, "bias", None), mean, var, _arg(bn, 3, "weight", None), _arg(bn, 4, "bias", None),
                float(_arg(bn, 7, "eps", 1e-5)), z, stride, padding, dilation, groups)
        with gm.graph.inserting_before(relu):
            new = gm.graph.call_function(conv_bn_relu, args)
        new.meta = dict(relu.meta)
        relu.replace_all_uses_with(new)
        for n in (relu, add, bn, conv):
            if n is not None:
                gm.graph.erase_node(n)
        done += 1
    return done
