"""Transformer text classifier: PFLlib's TransformerModel sizes, pooled over the real tokens.

Inputs are int64 token ids of shape (batch, max_len), right-padded with id 0 (see ``tokens.py``).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from flcore.trainmodel.text import FEATURE_DIM
from flcore.trainmodel.tokens import PAD, real_positions


class Transformer(nn.Module):
    """Token embeddings plus learned position embeddings (one per position up to ``max_len``), a
    two-layer ``nn.TransformerEncoder`` (8 heads, 2048-wide feed-forward, dropout 0.1, as PFLlib), the
    mean of the encoded real tokens, and ``fc``.

    Padding is masked out of attention and of the mean. PFLlib adds fixed sinusoidal positions and
    classifies from the encoder's first position (a class token). Learned positions are ordinary
    parameters: averaged, personalised and scored by FedLAG like any other layer, where a fixed table
    kept as a buffer would be averaged by aggregation too (buffers travel with the parameters).
    """

    def __init__(self, vocab_size: int, max_len: int, num_classes: int, width: int = FEATURE_DIM,
                 heads: int = 8, layers: int = 2, feedforward: int = 2048, dropout: float = 0.1):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, width, padding_idx=PAD)
        self.positions = nn.Embedding(max_len, width)
        layer = nn.TransformerEncoderLayer(width, heads, feedforward, dropout, batch_first=True)
        # No nested tensors: that evaluation-only shortcut for padded batches is a prototype API that
        # warns on every run, and the padding mask already keeps padded positions out of the result.
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        real = real_positions(tokens)
        steps = torch.arange(tokens.shape[1], device=tokens.device)
        encoded = self.encoder(self.embedding(tokens) + self.positions(steps), src_key_padding_mask=~real)
        weights = real.unsqueeze(2).to(encoded.dtype)
        return self.fc((encoded * weights).sum(dim=1) / weights.sum(dim=1))


def transformer(input_shape: Sequence[int], num_classes: int, vocab_size: int, max_len: int,
                width: int = FEATURE_DIM) -> nn.Module:
    """The builder ``models.build_model`` calls (the same signature as the other text models')."""
    return Transformer(vocab_size, max_len, num_classes, width=width)
