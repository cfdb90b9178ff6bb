"""An elastic vision-transformer space (AutoFormer-style weight entanglement) for small images.

The network is a compact-transformer one (Hassani et al., "Escaping the Big Data Paradigm with
Compact Transformers", 2021; :class:`ViTConfig`): a convolutional tokenizer, pre-norm
transformer blocks, a final LayerNorm, the mean over the tokens and a linear classifier.
The choices are AutoFormer's (Chen et al., ICCV 2021): the embedding dimension (one for the
whole network: the residual stream's width), the depth, and per block the number of heads
(each ``head_dim`` wide) and the MLP ratio. Weights are entangled: each layer has one max-size
weight and a subnet uses its leading slice (:mod:`hwnas.supernet.nn.vit`).

Architecture string: the embedding dimension, then the active blocks joined by ``-``, a block
written ``h{heads}m{mlp ratio}``; e.g. ``e192_h4m2-h3m1.5-h2m1-h4m2-h4m2``. The depth is the
number of blocks written, so every network has exactly one string.

This module does not import torch; :meth:`ViTSpace.build_supernet` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hwnas.supernet.layers import Layer
from hwnas.supernet.space import (
    SearchSpace,
    SpaceConfig,
    check_choice,
    restrict_choices,
)

from hwnas.core.errors import UserError

Block = tuple[int, float]  # (heads, mlp ratio)

#: The elastic dimensions, in the order a progressive schedule opens them (our choice: the
#: per-block widths first, then the depth, then the embedding dimension that every layer
#: shares; AutoFormer itself trains all of them at once, which the sandwich schedule does).
ELASTIC_DIMS = ("mlp_ratio", "heads", "depth", "embed")


@dataclass(frozen=True)
class ViTConfig(SpaceConfig):
    """Macro-architecture and choices of an elastic compact vision transformer.

    The network: a convolutional tokenizer -- ``len(tokenizer_channels) + 1`` 3×3 convolutions,
    each followed by ReLU and a 3×3 max pool of stride 2, the last one producing ``embed``
    channels, so a 32×32 image becomes 8×8 = 64 tokens with the default two stages -- ``depth``
    pre-norm transformer blocks (LayerNorm, multi-head self-attention, residual; LayerNorm, MLP
    with GELU, residual), a final LayerNorm, the mean over the tokens and a linear classifier.
    A block's attention Q/K/V width is ``heads × head_dim``; its MLP hidden width
    ``round(embed × ratio)``. There is no positional embedding: the zero-padded convolutions of
    the tokenizer carry position information (CCT's implementation makes the embedding
    optional, ``positional_embedding='none'``), and the layer list has no op for a learned
    additive tensor; adding one would be a new op.

    ``tokenizer_channels``: the widths of the tokenizer's convolutions before the last one
    (which outputs ``embed`` channels); each convolution is followed by ReLU and a stride-2
    max pool.
    """

    LABEL = "ViT"

    in_channels: int = 3
    image_size: int = 32
    num_classes: int = 10
    tokenizer_channels: tuple[int, ...] = (64,)
    tokenizer_kernel: int = 3
    embed_choices: tuple[int, ...] = (192, 224, 256)
    depth_choices: tuple[int, ...] = (5, 6, 7)
    heads_choices: tuple[int, ...] = (2, 3, 4)
    mlp_ratio_choices: tuple[float, ...] = (1.0, 1.5, 2.0)
    head_dim: int = 64
    ln_eps: float = 1e-5
    #: CCT's parts (Hassani et al. 2021), each off by default so that ``vit`` stays as shipped:
    #: ``seq_pool`` -- sequence pooling (a linear score per token, softmax over the tokens,
    #: their weighted sum) in place of the token mean; ``pos_embed`` -- a learned positional
    #: embedding added to the tokens; ``cct_norm`` -- CCT's block, which normalises the
    #: residual stream after the attention (``x = norm2(x + attn(norm1(x))); x + mlp(x)``);
    #: ``drop_path`` -- stochastic depth, rising linearly over the blocks to this rate;
    #: ``attn_drop`` -- dropout of the attention weights; ``dropout`` -- CCT's ``dropout_rate``:
    #: dropout of the tokens entering the blocks, of the attention projection's output, of
    #: the MLP's hidden units and of its output. These three act in training only;
    #: a network of depth ``d`` uses CCT's rates for ``d`` blocks (:func:`block_rates`).
    #: ``qkv_bias`` -- a bias in the Q/K/V projection (``vit``'s; CCT's has none).
    seq_pool: bool = False
    pos_embed: bool = False
    cct_norm: bool = False
    drop_path: float = 0.0
    attn_drop: float = 0.0
    qkv_bias: bool = True
    dropout: float = 0.0

    #: the CCT settings and their ``vit`` values: left out of ``to_dict`` at those values, so
    #: that the configuration stored with checkpoints written before they existed still matches
    CCT_OFF = {"seq_pool": False, "pos_embed": False, "cct_norm": False, "drop_path": 0.0,
               "attn_drop": 0.0, "qkv_bias": True, "dropout": 0.0}

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        for k, off in self.CCT_OFF.items():
            if d.get(k) == off:
                d.pop(k)
        return d

    def __post_init__(self) -> None:
        for name in ("embed_choices", "depth_choices", "heads_choices", "mlp_ratio_choices"):
            values = getattr(self, name)
            if not values or tuple(sorted(set(values))) != tuple(values):
                raise ValueError(f"{name} must be non-empty, sorted and unique, got {values}")
            if values[0] <= 0:
                raise ValueError(f"{name} must be positive, got {values}")
        for name in ("embed_choices", "depth_choices", "heads_choices"):
            if any(int(v) != v for v in getattr(self, name)):
                raise ValueError(f"{name} must be integers, got {getattr(self, name)}")
        if any(round(e * r) < 1 for e in self.embed_choices for r in self.mlp_ratio_choices):
            raise ValueError("every embed × mlp ratio must give at least one hidden unit")
        if self.head_dim < 1 or self.tokenizer_kernel < 1 or self.tokenizer_kernel % 2 == 0:
            raise ValueError("head_dim must be >= 1 and tokenizer_kernel odd and >= 1")
        if any(c < 1 for c in self.tokenizer_channels):
            raise ValueError(f"tokenizer_channels must be positive, got {self.tokenizer_channels}")
        if min(self.in_channels, self.image_size, self.num_classes) < 1 or self.ln_eps <= 0:
            raise ValueError("in_channels, image_size, num_classes and ln_eps must be positive")
        rates = (self.drop_path, self.attn_drop, self.dropout)
        if not all(0.0 <= r < 1.0 for r in rates):
            raise ValueError(f"drop_path, attn_drop and dropout must be in [0, 1), got {rates}")

    @property
    def max_depth(self) -> int:
        return self.depth_choices[-1]

    @property
    def token_grid(self) -> int:
        """Side of the token grid: the image size halved (rounded up) by each tokenizer pool."""
        size = self.image_size
        for _ in range(len(self.tokenizer_channels) + 1):
            size = (size - 1) // 2 + 1
        return size

    @property
    def num_tokens(self) -> int:
        return self.token_grid**2

    def hidden(self, embed: int, ratio: float) -> int:
        """The MLP's hidden width for an embedding dimension and a ratio."""
        return round(embed * ratio)



@dataclass(frozen=True)
class ViTArch:
    """One member of the space: the embedding dimension and the (heads, mlp ratio) of each
    active block."""

    embed: int
    blocks: tuple[Block, ...]

    @property
    def depth(self) -> int:
        return len(self.blocks)


_EMBED_RE = re.compile(r"^e(\d+)$")
_BLOCK_RE = re.compile(r"^h(\d+)m(\d+(?:\.\d+)?)$")


def _ratio_text(ratio: float) -> str:
    return format(float(ratio), "g")


class ViTSpace(SearchSpace[ViTArch]):
    """Elastic compact vision transformer; see the module docstring."""

    def __init__(self, config: ViTConfig | None = None, name: str = "vit") -> None:
        self._set_config(config or ViTConfig(), name)

    def describe(self) -> str:
        c = self.cfg

        def values(v) -> str:
            return "{" + ",".join(_ratio_text(x) for x in v) + "}"

        return (f"{self.name}: elastic compact vision transformer ({c.num_tokens} tokens, embed "
                f"{values(c.embed_choices)}, depth {values(c.depth_choices)}, heads "
                f"{values(c.heads_choices)}×{c.head_dim}, mlp ratio "
                f"{values(c.mlp_ratio_choices)}), input {self.input_shape}, "
                f"{self.num_classes} classes")

    # -- elastic dimensions ----------------------------------------------------------------------
    def elastic_choices(self) -> dict[str, tuple]:
        """The values of each elastic dimension, in the order a progressive schedule opens them."""
        c = self.cfg
        table = {"mlp_ratio": c.mlp_ratio_choices, "heads": c.heads_choices,
                 "depth": c.depth_choices, "embed": c.embed_choices}
        return {d: table[d] for d in ELASTIC_DIMS}

    def restrict(self, choices: dict[str, Any] | None) -> ViTSpace:
        """The sub-space whose dimensions take only the given values (training schedules)."""
        if not choices:
            return self
        changes = restrict_choices(self, choices, kind="numbers",
                                   number=lambda dim, v: float(v) if dim == "mlp_ratio" else int(v))
        return type(self)(replace(self.cfg, **changes), name=self.name)

    # -- members ---------------------------------------------------------------------------------
    def sample(self, rng: np.random.Generator) -> ViTArch:
        c = self.cfg
        embed = int(rng.choice(c.embed_choices))
        depth = int(rng.choice(c.depth_choices))
        blocks = tuple((int(rng.choice(c.heads_choices)), float(rng.choice(c.mlp_ratio_choices)))
                       for _ in range(depth))
        return ViTArch(embed, blocks)

    def smallest(self) -> ViTArch:
        c = self.cfg
        block = (c.heads_choices[0], float(c.mlp_ratio_choices[0]))
        return ViTArch(c.embed_choices[0], (block,) * c.depth_choices[0])

    def largest(self) -> ViTArch:
        c = self.cfg
        block = (c.heads_choices[-1], float(c.mlp_ratio_choices[-1]))
        return ViTArch(c.embed_choices[-1], (block,) * c.depth_choices[-1])

    def validate(self, arch: ViTArch) -> ViTArch:
        c = self.cfg
        if not isinstance(arch, ViTArch):
            raise UserError(f"expected a ViTArch for space {self.name}, got {type(arch).__name__}")
        check_choice(arch.embed, c.embed_choices, "embedding dimension")
        check_choice(len(arch.blocks), c.depth_choices, "depth")
        for b, (heads, ratio) in enumerate(arch.blocks):
            check_choice(heads, c.heads_choices, f"heads of block {b}")
            check_choice(ratio, c.mlp_ratio_choices, f"mlp ratio of block {b}")
        return arch

    # -- string form -----------------------------------------------------------------------------
    def to_string(self, arch: ViTArch) -> str:
        self.validate(arch)
        blocks = "-".join(f"h{h}m{_ratio_text(r)}" for h, r in arch.blocks)
        return f"e{arch.embed}_{blocks}"

    def from_string(self, text: str) -> ViTArch:
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"empty architecture string for space {self.name}")
        example = self.to_string(self.smallest())
        head, sep, rest = text.strip().partition("_")
        m = _EMBED_RE.match(head)
        if not sep or not m:
            raise UserError(f"malformed architecture {text!r} for space {self.name}; expected "
                            f"'e<embed>_' then 'h<heads>m<mlp ratio>' blocks joined by '-' "
                            f"(e.g. {example!r})")
        blocks = []
        for block_text in rest.split("-"):
            b = _BLOCK_RE.match(block_text)
            if not b:
                raise UserError(f"malformed block {block_text!r} in architecture {text!r}; "
                                f"expected 'h<heads>m<mlp ratio>' (e.g. {example!r})")
            blocks.append((int(b.group(1)), float(b.group(2))))
        return self.validate(ViTArch(int(m.group(1)), tuple(blocks)))

    # -- features --------------------------------------------------------------------------------
    @property
    def feature_names(self) -> list[str]:
        c = self.cfg
        names = [f"embed{e}" for e in c.embed_choices] + [f"depth{d}" for d in c.depth_choices]
        for b in range(c.max_depth):
            names += [f"b{b}_heads{h}" for h in c.heads_choices]
            names += [f"b{b}_mlp{_ratio_text(r)}" for r in c.mlp_ratio_choices]
        return names

    def encode(self, arch: ViTArch) -> np.ndarray:
        """One-hot embedding dimension and depth, then one-hot heads and mlp ratio per block
        slot (all zero for the slots beyond the depth)."""
        self.validate(arch)
        c = self.cfg
        out = [float(arch.embed == e) for e in c.embed_choices]
        out += [float(arch.depth == d) for d in c.depth_choices]
        for b in range(c.max_depth):
            heads, ratio = arch.blocks[b] if b < arch.depth else (None, None)
            out += [float(heads == h) for h in c.heads_choices]
            out += [float(ratio == r) for r in c.mlp_ratio_choices]
        return np.asarray(out, dtype=np.float32)

    # -- layers ----------------------------------------------------------------------------------
    def block_layers(self, p: str, embed: int, heads: int, ratio: float) -> list[Layer]:
        """Layers of one pre-norm transformer block on ``num_tokens`` tokens (names match the
        modules of :class:`hwnas.supernet.nn.vit.ViTBlock`)."""
        c = self.cfg
        n, d = c.num_tokens, c.head_dim
        qkv = heads * d
        hidden = c.hidden(embed, ratio)
        t = {"in_h": n, "in_w": 1}
        return [
            Layer(f"{p}.norm1", "layernorm", embed, embed, bias=True, **t),
            Layer(f"{p}.attn.qkv", "linear", embed, 3 * qkv, bias=c.qkv_bias, **t),
            Layer(f"{p}.attn.qk", "matmul", qkv, heads * n, groups=heads, **t),
            Layer(f"{p}.attn.softmax", "softmax", heads * n, heads * n, **t),
            Layer(f"{p}.attn.av", "matmul", heads * n, qkv, groups=heads, **t),
            Layer(f"{p}.attn.proj", "linear", qkv, embed, bias=True, **t),
            Layer(f"{p}.add", "add", embed, embed, **t),
            Layer(f"{p}.norm2", "layernorm", embed, embed, bias=True, **t),
            Layer(f"{p}.mlp.fc1", "linear", embed, hidden, bias=True, **t),
            Layer(f"{p}.mlp.act", "gelu", hidden, hidden, **t),
            Layer(f"{p}.mlp.fc2", "linear", hidden, embed, bias=True, **t),
            Layer(f"{p}.add_1", "add", embed, embed, **t),
        ]

    def layers(self, arch: ViTArch) -> list[Layer]:
        self.validate(arch)
        c = self.cfg
        size, in_ch = c.image_size, c.in_channels
        layers: list[Layer] = []
        widths = (*c.tokenizer_channels, arch.embed)
        for i, out_ch in enumerate(widths):
            conv = Layer(f"tokenizer.{i}.conv", "conv", in_ch, out_ch, c.tokenizer_kernel, 1, 1,
                         size, size, activation="relu")
            pool = Layer(f"tokenizer.{i}.pool", "pool", out_ch, out_ch, 3, 2, 1, size, size,
                         extra={"mode": "max"})
            layers += [conv, pool]
            size, in_ch = pool.out_h, out_ch
        n, e = c.num_tokens, arch.embed
        if c.pos_embed:
            layers.append(Layer("pos_add", "add", e, e, in_h=n, in_w=1))
        for b, (heads, ratio) in enumerate(arch.blocks):
            layers += self.block_layers(f"blocks.{b}", e, heads, ratio)
        layers.append(Layer("norm", "layernorm", e, e, bias=True, in_h=n, in_w=1))
        if c.seq_pool:  # a score per token, softmax over the tokens, (1 x N) @ (N x e)
            layers += [Layer("attention_pool", "linear", e, 1, bias=True, in_h=n, in_w=1),
                       Layer("pool_softmax", "softmax", n, n),
                       Layer("pool", "matmul", n, e)]
        else:
            layers.append(Layer("pool", "avgpool", e, e, in_h=n, in_w=1))
        layers.append(Layer("classifier", "linear", e, c.num_classes, bias=True))
        return layers

    # -- Optuna ----------------------------------------------------------------------------------
    def suggest(self, trial: Any) -> ViTArch:
        """Suggest every choice, inactive block slots included, so that every trial has the
        same parameter set (multivariate TPE, NSGA-II); slots beyond the depth are ignored."""
        c = self.cfg
        embed = int(trial.suggest_categorical("embed", list(c.embed_choices)))
        depth = int(trial.suggest_categorical("depth", list(c.depth_choices)))
        blocks = []
        for b in range(c.max_depth):
            heads = trial.suggest_categorical(f"b{b}_heads", list(c.heads_choices))
            ratio = trial.suggest_categorical(f"b{b}_mlp_ratio",
                                              [float(r) for r in c.mlp_ratio_choices])
            blocks.append((int(heads), float(ratio)))
        return ViTArch(embed, tuple(blocks[:depth]))

    def to_params(self, arch: ViTArch) -> dict[str, Any]:
        self.validate(arch)
        params: dict[str, Any] = {"embed": arch.embed, "depth": arch.depth}
        for b in range(self.cfg.max_depth):
            heads, ratio = arch.blocks[b] if b < arch.depth else arch.blocks[-1]
            params[f"b{b}_heads"] = heads
            params[f"b{b}_mlp_ratio"] = float(ratio)
        return params

    # -- training --------------------------------------------------------------------------------
    def finetune_defaults(self) -> dict[str, Any]:
        """A tenth of the convolutional spaces' fine-tuning rate: at theirs, a short W4A8 QAT
        of the CIFAR-10 vit undid its PTQ start; at 3e-4 it improves on it
        (benchmarks/quant_cifar10.md, "QAT learning rate for vit")."""
        return {"lr": 3e-4}

    def training_defaults(self) -> dict[str, Any]:
        """The compact-transformer recipe: AdamW with decoupled weight decay, warm-up, label
        smoothing, delayed shrinking, and (for CIFAR-sized RGB images) TrivialAugment, crop,
        flip and cutout. No MixUp/CutMix: on CIFAR-10, within the training-time budget, they
        lowered every subnet's accuracy (benchmarks/supernet_cifar10.md); ``--mixup`` and
        ``--cutmix`` turn them on. No teacher either: ``--teacher`` (a convolutional network
        hwnas trained on the same images) added about a point on CIFAR-10, but a default naming
        one dataset's checkpoint would not hold for another.

        Why each (benchmarks/supernet_cifar10.md says more): vision transformers on small
        datasets are trained with AdamW, weight decay 0.05, a few warm-up epochs, label
        smoothing 0.1 and strong augmentation (CCT, AutoFormer, DeiT); ``lr`` is DeiT's
        linear rule at batch 512 (twice that, CCT's rate scaled by the square root of the
        batch, diverged on CIFAR-10 in bf16 within 40 epochs). The plain sandwich from random
        weights collapses this supernet (in-place distillation pulls every subnet towards the
        untrained largest one's near-uniform predictions, and all share the leading slices of
        every weight), so the full network trains alone first (DEpS); ``largest+mean`` keeps
        the largest subnet's full gradient once shrinking starts, as for the convolutional
        supernets. The CIFAR-10 batch size and epochs are the caller's (``--batch-size 512``);
        the default batch stays small for CPU-sized datasets."""
        c = self.cfg
        defaults: dict[str, Any] = {
            "schedule": "deps", "full_fraction": 0.4, "optimizer": "adamw", "lr": 5e-4,
            "weight_decay": 0.05, "warmup_epochs": 5.0, "label_smoothing": 0.1,
            "subnet_loss": "largest+mean"}
        if c.in_channels == 3 and c.image_size == 32:
            defaults.update(augment="trivial_crop_flip_cutout")
        return defaults

    # -- torch -----------------------------------------------------------------------------------
    def build_supernet(self):
        from hwnas.supernet.nn.vit import ViTSupernet

        return ViTSupernet(self)


#: CCT's CIFAR models as a space (Hassani et al. 2021): ``vit`` with sequence pooling, a
#: learned positional embedding, CCT's block, stochastic depth 0.1, attention dropout 0.1,
#: dropout 0.1 and no Q/K/V bias; embed 128-256, depth 2-7. Its smallest member is CCT-2/3x2,
#: its largest CCT-7/3x2 (parameter for parameter: 283,723 and 3,853,259 as in CCT's README).
#: Dropout 0.1 is what CCT's code ran when its README's 200-epoch CIFAR table was made (April
#: 2021: ``CCT`` passed ``dropout=0.`` to a classifier whose argument was ``dropout_rate``,
#: default 0.1, so 0.1 held; renamed in May 2021); benchmarks/supernet_cifar10.md, "Session 34".
CCT_CONFIG = ViTConfig(embed_choices=(128, 192, 256), depth_choices=(2, 3, 4, 5, 6, 7),
                       seq_pool=True, pos_embed=True, cct_norm=True, drop_path=0.1,
                       attn_drop=0.1, qkv_bias=False, dropout=0.1)


class CCTSpace(ViTSpace):
    """The ``cct`` space: :data:`CCT_CONFIG` and CCT's own CIFAR recipe."""

    #: a variant of ``vit``: ``--space vit`` runs on a shipped cct supernet (SearchSpace.family)
    family = "vit"

    def __init__(self, config: ViTConfig | None = None, name: str = "cct") -> None:
        super().__init__(config or CCT_CONFIG, name)

    def training_defaults(self) -> dict[str, Any]:
        """The recipe of CCT's 200-epoch CIFAR-10 figures (CCT-7/3x2 93.83 %, CCT-2/3x2
        89.17 %): its first training script (``main.py``, later ``examples/main.py``), not
        ``configs/datasets/cifar10.yml``, which is the timm script's 300-epoch recipe of its
        later checkpoints. AdamW at 5e-4 for batch 128, weight decay 0.03, 5 warm-up epochs,
        cosine to 0, label smoothing 0.1, no gradient clipping, no MixUp or CutMix, and
        AutoAugment's CIFAR-10 policy, a 4-pixel padded crop and a flip
        (``autoaugment_crop_flip``). Differences left (benchmarks/supernet_cifar10.md,
        "Session 30"): CCT decays every parameter, hwnas not norms, biases and the
        positional embedding; CCT's warm-up and cosine step per epoch, hwnas's per step.
        The supernet schedule is ``vit``'s (the full network first)."""
        defaults = super().training_defaults()
        defaults.update(lr=5e-4, weight_decay=0.03, warmup_epochs=5.0, mixup=0.0, cutmix=0.0,
                        grad_clip=0.0, batch_size=128, label_smoothing=0.1)
        c = self.cfg
        if c.in_channels == 3 and c.image_size == 32:
            defaults.update(augment="autoaugment_crop_flip")
        return defaults
