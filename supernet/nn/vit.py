"""The elastic vision-transformer supernet of :class:`hwnas.supernet.spaces.vit.ViTSpace` and its
static subnets.

Weight entanglement (AutoFormer): every layer keeps one max-size weight and a subnet uses its
leading slice -- the first ``embed`` channels of the residual stream, the first ``heads`` heads
of Q, K and V (each of the three sliced on its own), the first ``hidden`` MLP units. The
active configuration is passed in: input widths follow the incoming tensor, output widths are
arguments, each block stores its own heads and MLP ratio (``set_active``); no global flags.

``extract(arch)`` returns a plain :class:`ViTNet` with copies of the active slices, which
computes what the supernet computes, exports to ONNX as is, and whose module names are the layer
names of :meth:`ViTSpace.layers`.

``forward_masked(x, arch_masks(arch))`` computes the same subnet at the largest one's shapes, the
inactive channels, heads, hidden units and blocks zeroed by masks: one compiled graph for every
subnet, where sliced shapes need one per architecture. Training compiles it for a step's random
subnets (``compile_scope="subnets"``); the eager random subnets were most of a CCT supernet
step's time on an H100 (``benchmarks/supernet_cifar10.md``, "Session 41").
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from hwnas.supernet.nn.dynamic_ops import (
    DynamicConv2d,
    DynamicLayerNorm,
    DynamicLinear,
    DynamicQKV,
)
from hwnas.supernet.nn.supernet import Supernet
from hwnas.supernet.spaces.vit import ViTArch, ViTSpace
from torch import nn

class MatMul(nn.Module):
    """``scale · a @ bᵀ`` (``transpose_b``) or ``scale · a @ b`` over the last two axes: a
    product of two activations (attention scores, attention × values), a module so that it
    has a name in the layer list and forward hooks see it."""

    def __init__(self, transpose_b: bool = False, scale: float = 1.0) -> None:
        super().__init__()
        self.transpose_b, self.scale = transpose_b, float(scale)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(a, b.transpose(-2, -1) if self.transpose_b else b)
        return out * self.scale if self.scale != 1.0 else out


# -- static modules ------------------------------------------------------------------------------

class Attention(nn.Module):
    """Static multi-head self-attention: qkv projection, scaled Q·Kᵀ, softmax, × V, projection."""

    def __init__(self, qkv: nn.Linear, proj: nn.Linear, heads: int, head_dim: int,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = qkv
        self.qk = MatMul(transpose_b=True, scale=head_dim**-0.5)
        self.softmax = nn.Softmax(dim=-1)
        # floats, not modules: no node in the exported graph
        self.attn_drop, self.proj_drop = attn_drop, proj_drop
        self.av = MatMul()
        self.proj = proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, N, 3·h·d) -> (3, B, h, N, d)
        qkv = self.qkv(x).unflatten(-1, (3, self.heads, self.head_dim)).permute(2, 0, 3, 1, 4)
        attn = self.softmax(self.qk(qkv[0], qkv[1]))
        if self.training and self.attn_drop:
            attn = F.dropout(attn, self.attn_drop)
        out = self.av(attn, qkv[2]).transpose(1, 2).flatten(2)
        return dropout(self.proj(out), self.proj_drop, self.training)


class Mlp(nn.Module):
    """``fc2(act(fc1 x))``, with CCT's dropout after the activation and after ``fc2``."""

    def __init__(self, fc1: nn.Linear, fc2: nn.Linear, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = fc1, nn.GELU(), fc2
        self.drop = drop  # a float, not a module: no node in the exported graph

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = dropout(self.act(self.fc1(x)), self.drop, self.training)
        return dropout(self.fc2(y), self.drop, self.training)


def dropout(x: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Element-wise dropout in training at ``rate`` (> 0); the identity otherwise."""
    return F.dropout(x, rate) if training and rate > 0.0 else x


def drop_path(x: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Stochastic depth (Huang et al. 2016): in training, zero a residual branch for a random
    ``rate`` of the samples and scale the others by ``1 / (1 - rate)``; the identity otherwise."""
    if not training or rate <= 0.0:
        return x
    keep = torch.empty((x.size(0),) + (1,) * (x.dim() - 1), device=x.device, dtype=x.dtype)
    return x * keep.bernoulli_(1.0 - rate).div_(1.0 - rate)


def masked_norm(x: torch.Tensor, norm: nn.LayerNorm, mask: torch.Tensor,
                count: torch.Tensor) -> torch.Tensor:
    """``norm`` over the ``count`` channels that ``mask`` keeps, the others zero: what a
    :class:`~hwnas.supernet.nn.dynamic_ops.DynamicLayerNorm` computes on the leading slice."""
    mean = (x * mask).sum(-1, keepdim=True) / count
    xc = (x - mean) * mask
    var = (xc * xc).sum(-1, keepdim=True) / count
    return xc * torch.rsqrt(var + norm.eps) * norm.weight + norm.bias * mask


def drop_path_masked(x: torch.Tensor, rate: torch.Tensor, training: bool) -> torch.Tensor:
    """:func:`drop_path` with the rate a tensor (no graph per rate); rate 0 keeps every sample.
    ``training`` False (evaluation, or a space without stochastic depth): the identity."""
    if not training:
        return x
    keep = torch.bernoulli((1.0 - rate).expand((x.size(0),) + (1,) * (x.dim() - 1)))
    return x * keep.to(x.dtype) / (1.0 - rate)


def block_rates(rate: float, depth: int) -> list[float]:
    """CCT's stochastic-depth rates: rising linearly from 0 at the first block to ``rate`` at
    the last of ``depth`` blocks -- the active network's depth, so that a depth-2 subnet drops
    its second block at ``rate`` as CCT-2 does (``torch.linspace(0, rate, depth)``)."""
    return [rate * b / (depth - 1) if depth > 1 else 0.0 for b in range(depth)]


@torch.no_grad()
def init_transformer(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """CCT's initialisation (its Tokenizer and TransformerClassifier): convolutions
    He-normal over the fan-in, linear layers truncated normal with std 0.02 and zero bias,
    LayerNorms 1 and 0, the positional embedding truncated normal with std 0.2. What the
    supernet's own operators start from (:mod:`hwnas.supernet.nn.dynamic_ops`, fan-in aside),
    for a standalone network trained from scratch."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, generator=generator)
        elif isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02, generator=generator)
        elif isinstance(m, nn.LayerNorm):
            m.reset_parameters()
        if isinstance(m, (nn.Conv2d, nn.Linear)) and m.bias is not None:
            m.bias.zero_()
    if getattr(model, "pos_embed", None) is not None:
        nn.init.trunc_normal_(model.pos_embed, std=0.2, generator=generator)
    return model


class ViTBlock(nn.Module):
    """Static transformer block (names match :meth:`ViTSpace.block_layers`): pre-norm, or with
    ``cct_norm`` CCT's block, whose second norm normalises the residual stream itself."""

    def __init__(self, norm1: nn.LayerNorm, attn: Attention, norm2: nn.LayerNorm, mlp: Mlp,
                 cct_norm: bool = False, drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp
        self.cct_norm, self.drop_path = cct_norm, drop_path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + drop_path(self.attn(self.norm1(x)), self.drop_path, self.training)
        if self.cct_norm:
            x = self.norm2(x)
            return x + drop_path(self.mlp(x), self.drop_path, self.training)
        return x + drop_path(self.mlp(self.norm2(x)), self.drop_path, self.training)


class TokenizerStage(nn.Module):
    """3×3 convolution, ReLU, 3×3 max pool of stride 2."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.conv, self.act = conv, nn.ReLU()
        self.pool = nn.MaxPool2d(3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.act(self.conv(x)))


class ViTNet(nn.Module):
    """A standalone subnet: tokenizer, (positional embedding), blocks, norm, token mean or
    sequence pooling, classifier.

    Made of ``nn.Conv2d`` / ``nn.LayerNorm`` / ``nn.Linear`` / ``nn.Softmax`` / ``nn.GELU`` and
    :class:`MatMul`. The attention products are modules too, so forward hooks see every layer
    of the layer list, and its ``Conv2d``/``Linear`` modules are exactly the list's
    ``conv``/``linear`` layers (what a quantization policy names).
    """

    def __init__(self, tokenizer: list[TokenizerStage], blocks: list[ViTBlock],
                 norm: nn.LayerNorm, classifier: nn.Linear, pos_embed: torch.Tensor | None = None,
                 attention_pool: nn.Linear | None = None, drop: float = 0.0) -> None:
        super().__init__()
        self.tokenizer = nn.Sequential(*tokenizer)
        self.pos_embed = nn.Parameter(pos_embed) if pos_embed is not None else None
        self.drop = drop  # CCT's dropout of the tokens before the blocks (training only)
        self.blocks = nn.Sequential(*blocks)
        self.norm = norm
        # CCT's sequence pooling: a score per token, softmax over the tokens, the tokens'
        # weighted sum (a product of two activations); named as in the layer list
        self.seq_pool = attention_pool is not None
        if attention_pool is not None:
            self.attention_pool, self.pool_softmax, self.pool = (
                attention_pool, nn.Softmax(dim=1), MatMul())
        self.classifier = classifier

    def init_weights(self, generator: torch.Generator) -> None:
        """Fresh weights for training from scratch (:func:`init_transformer`; what
        :func:`hwnas.supernet.train.reinitialize` calls)."""
        init_transformer(self, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tokenizer(x).flatten(2).transpose(1, 2)  # (B, C, H, W) -> (B, H·W, C)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        x = self.norm(self.blocks(dropout(x, self.drop, self.training)))
        if self.seq_pool:
            w = self.pool_softmax(self.attention_pool(x)).transpose(1, 2)  # (B, 1, N)
            return self.classifier(self.pool(w, x).flatten(1))
        return self.classifier(x.mean(1))


# -- the supernet (its operators: hwnas.supernet.nn.dynamic_ops) ----------------------------------

class DynamicViTBlock(nn.Module):
    """A pre-norm block with elastic heads and MLP ratio; the embedding width follows the input."""

    def __init__(self, space: ViTSpace) -> None:
        super().__init__()
        c = space.cfg
        max_e, max_h = c.embed_choices[-1], c.heads_choices[-1]
        self.space, self.head_dim = space, c.head_dim
        self.norm1 = DynamicLayerNorm(max_e, eps=c.ln_eps)
        self.qkv = DynamicQKV(max_e, max_h, c.head_dim, bias=c.qkv_bias)
        self.proj = DynamicLinear(max_h * c.head_dim, max_e)
        self.norm2 = DynamicLayerNorm(max_e, eps=c.ln_eps)
        self.fc1 = DynamicLinear(max_e, c.hidden(max_e, c.mlp_ratio_choices[-1]))
        self.fc2 = DynamicLinear(c.hidden(max_e, c.mlp_ratio_choices[-1]), max_e)
        self.active_heads = max_h
        self.active_ratio = float(c.mlp_ratio_choices[-1])
        self.drop_path = 0.0  # this block's stochastic-depth rate (set with the active subnet)

    def _attend(self, qkv: torch.Tensor, h: int, regularise: bool = True) -> torch.Tensor:
        """Attention of ``h`` heads over the fused Q/K/V projection (B, N, 3·h·d): (B, h, N, d);
        attention dropout in training where ``regularise``."""
        d = self.head_dim
        y = qkv.unflatten(-1, (3, h, d)).permute(2, 0, 3, 1, 4)
        if self.training:  # one fused kernel (flash / memory-efficient on a GPU), same maths
            return F.scaled_dot_product_attention(y[0], y[1], y[2], scale=d**-0.5,
                                                  dropout_p=self.space.cfg.attn_drop if regularise
                                                  else 0.0)
        # the static model's operations, so extract() gives identical outputs
        attn = torch.softmax(torch.matmul(y[0], y[1].transpose(-2, -1)) * d**-0.5, dim=-1)
        return torch.matmul(attn, y[2])

    def forward(self, x: torch.Tensor, regularise: bool = True) -> torch.Tensor:
        """The active subnet's block; ``regularise`` False: no dropout or stochastic depth
        (the supernet's :attr:`~hwnas.supernet.nn.supernet.Supernet.regularise`)."""
        c = self.space.cfg
        e, h = x.size(-1), self.active_heads
        y = self._attend(self.qkv(self.norm1(x), h), h, regularise).transpose(1, 2).flatten(2)
        p, t = c.dropout, self.training and regularise
        x = x + drop_path(dropout(self.proj(y, e), p, t), self.drop_path, t)
        if c.cct_norm:
            x = self.norm2(x)
        y = F.gelu(self.fc1(x if c.cct_norm else self.norm2(x), c.hidden(e, self.active_ratio)))
        return x + drop_path(dropout(self.fc2(dropout(y, p, t), e), p, t), self.drop_path, t)

    def forward_masked(self, x: torch.Tensor, embed: tuple[torch.Tensor, torch.Tensor],
                       heads: torch.Tensor, hidden: torch.Tensor, rate: torch.Tensor,
                       regularise: bool = True) -> torch.Tensor:
        """:meth:`forward` at full width: ``embed`` (the channel mask, its count), ``heads`` /
        ``hidden`` (this block's head and MLP-unit masks) and ``rate`` (stochastic depth) are
        tensors of :meth:`ViTSupernet.arch_masks`."""
        c, (m, n), t = self.space.cfg, embed, self.training and regularise
        h, e = heads.numel(), m.numel()
        y = self._attend(self.qkv(masked_norm(x, self.norm1, m, n), h), h, regularise)
        y = (y * heads.view(1, h, 1, 1)).transpose(1, 2).flatten(2)
        p, dp = c.dropout, t and c.drop_path > 0
        x = x + drop_path_masked(dropout(self.proj(y, e) * m, p, t), rate, dp)
        if c.cct_norm:
            x = masked_norm(x, self.norm2, m, n)
        y = F.gelu(self.fc1(x if c.cct_norm else masked_norm(x, self.norm2, m, n), hidden.numel()))
        y = dropout(y * hidden, p, t)
        return x + drop_path_masked(dropout(self.fc2(y, e) * m, p, t), rate, dp)

    def static(self, embed: int) -> ViTBlock:
        c, h = self.space.cfg, self.active_heads
        hidden = c.hidden(embed, self.active_ratio)
        attn = Attention(self.qkv.static(embed, h), self.proj.static(h * self.head_dim, embed),
                         h, self.head_dim, attn_drop=c.attn_drop, proj_drop=c.dropout)
        mlp = Mlp(self.fc1.static(embed, hidden), self.fc2.static(hidden, embed), drop=c.dropout)
        return ViTBlock(self.norm1.static(embed), attn, self.norm2.static(embed), mlp,
                        cct_norm=c.cct_norm, drop_path=self.drop_path)


class ViTSupernet(Supernet):
    """Weight-sharing supernet of a :class:`ViTSpace`; starts with the largest subnet active."""

    def __init__(self, space: ViTSpace) -> None:
        super().__init__()
        c = space.cfg
        self.space = space
        max_e = c.embed_choices[-1]
        self.tokenizer = nn.ModuleList()
        in_ch = c.in_channels
        for ch in c.tokenizer_channels:
            self.tokenizer.append(DynamicConv2d(in_ch, ch, c.tokenizer_kernel))
            in_ch = ch
        self.tokenizer.append(DynamicConv2d(in_ch, max_e, c.tokenizer_kernel))
        self.pos_embed = None
        if c.pos_embed:  # CCT's learnable positional embedding (its initialisation)
            self.pos_embed = nn.Parameter(torch.empty(1, c.num_tokens, max_e))
            nn.init.trunc_normal_(self.pos_embed, std=0.2)
        self.blocks = nn.ModuleList(DynamicViTBlock(space) for _ in range(c.max_depth))
        self.norm = DynamicLayerNorm(max_e, eps=c.ln_eps)
        self.attention_pool = DynamicLinear(max_e, 1) if c.seq_pool else None
        self.classifier = DynamicLinear(max_e, c.num_classes)
        self.active_embed, self.active_depth = max_e, c.max_depth
        self.set_active(space.largest())

    def set_active(self, arch: ViTArch | str) -> ViTArch:
        """Select the subnet ``arch`` (an architecture or its string) for later forward passes."""
        arch = self.space.parse(arch)
        self.active_embed, self.active_depth = arch.embed, arch.depth
        rates = block_rates(self.space.cfg.drop_path, arch.depth)
        for block, (heads, ratio), rate in zip(self.blocks, arch.blocks, rates):
            block.active_heads, block.active_ratio, block.drop_path = heads, float(ratio), rate
        return arch

    def active_arch(self) -> ViTArch:
        return ViTArch(self.active_embed, tuple((b.active_heads, b.active_ratio)
                                                for b in self.blocks[: self.active_depth]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        widths = [*self.space.cfg.tokenizer_channels, self.active_embed]
        for conv, width in zip(self.tokenizer, widths):
            x = F.max_pool2d(F.relu(conv(x, width)), 3, 2, 1)
        x = x.flatten(2).transpose(1, 2)
        if self.pos_embed is not None:
            x = x + self.pos_embed[..., : x.size(-1)]
        x = dropout(x, self.space.cfg.dropout, self.training and self.regularise)
        for block in self.blocks[: self.active_depth]:
            x = block(x, self.regularise)
        return self._classify(self.norm(x))

    def _classify(self, x: torch.Tensor) -> torch.Tensor:
        """Pooling (sequence pooling as ViTNet computes it, else the tokens' mean), classifier."""
        if self.attention_pool is not None:
            w = torch.softmax(self.attention_pool(x, 1), dim=1).transpose(1, 2)
            return self.classifier(torch.matmul(w, x).flatten(1), self.space.cfg.num_classes)
        return self.classifier(x.mean(1), self.space.cfg.num_classes)

    def arch_masks(self, arch: ViTArch | str, device: torch.device | str = "cpu"
                   ) -> tuple[torch.Tensor, ...]:
        """The tensors of :meth:`forward_masked` for ``arch``: the embedding channels' mask and
        count, then per block (all ``max_depth``) whether it is active, its heads' and MLP
        units' masks and its stochastic-depth rate. Filled on the host (one copy each to
        ``device``, not a kernel per entry)."""
        c, arch = self.space.cfg, self.space.parse(arch)
        max_e, max_h = c.embed_choices[-1], c.heads_choices[-1]
        max_hidden = c.hidden(max_e, c.mlp_ratio_choices[-1])
        active, rates = np.zeros(c.max_depth), np.zeros(c.max_depth)
        heads, hidden = np.zeros((c.max_depth, max_h)), np.zeros((c.max_depth, max_hidden))
        for b, ((h, ratio), rate) in enumerate(zip(arch.blocks,
                                                   block_rates(c.drop_path, arch.depth))):
            active[b], rates[b] = 1.0, rate
            heads[b, :h], hidden[b, : c.hidden(arch.embed, ratio)] = 1.0, 1.0
        embed = (np.arange(max_e) < arch.embed).astype(np.float32)
        return tuple(torch.as_tensor(np.asarray(a, dtype=np.float32), device=device)
                     for a in (embed, float(arch.embed), active, heads, hidden, rates))

    def forward_masked(self, x: torch.Tensor, masks: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The subnet of ``masks`` (:meth:`arch_masks`) at the largest subnet's shapes: the same
        outputs as :meth:`forward` after ``set_active`` (up to float rounding), whatever
        subnet is active."""
        c = self.space.cfg
        m, n, active, heads, hidden, rates = masks
        for conv in self.tokenizer:
            x = F.max_pool2d(F.relu(conv(x, conv.weight.size(0))), 3, 2, 1)
        x = (x * m.view(1, -1, 1, 1)).flatten(2).transpose(1, 2)
        if self.pos_embed is not None:
            x = x + self.pos_embed * m
        x = dropout(x, c.dropout, self.training and self.regularise)
        for b, block in enumerate(self.blocks):
            y = block.forward_masked(x, (m, n), heads[b], hidden[b], rates[b], self.regularise)
            x = torch.where(active[b] > 0, y, x)
        return self._classify(masked_norm(x, self.norm, m, n))

    def static_net(self) -> ViTNet:
        c, e = self.space.cfg, self.active_embed
        widths = [*c.tokenizer_channels, e]
        tokenizer, in_ch = [], c.in_channels
        for conv, width in zip(self.tokenizer, widths):
            tokenizer.append(TokenizerStage(conv.static(in_ch, width)))
            in_ch = width
        pos = self.pos_embed[..., :e].clone() if self.pos_embed is not None else None
        pool = self.attention_pool.static(e, 1) if self.attention_pool is not None else None
        return ViTNet(tokenizer, [b.static(e) for b in self.blocks[: self.active_depth]],
                      self.norm.static(e), self.classifier.static(e, c.num_classes),
                      pos_embed=pos, attention_pool=pool, drop=c.dropout)
