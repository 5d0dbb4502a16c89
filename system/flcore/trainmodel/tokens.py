"""Token-id inputs of the text models: int64 ids of shape (batch, max_len), right-padded with id 0.

A sequence's length is taken to end at its last non-padding token, so a stray 0 inside a text is kept
as a token. A sequence of padding only counts as one (padding) token: its embedding is the zero padding
row, and every pooling, packing and attention mask then has at least one position to work on, where an
empty sequence would crash packing or turn an all-masked softmax into NaN.
"""
from __future__ import annotations

import torch

PAD = 0


def sequence_lengths(tokens: torch.Tensor) -> torch.Tensor:
    """Per sequence, the position after its last non-padding token (at least 1), as int64."""
    positions = torch.arange(1, tokens.shape[1] + 1, device=tokens.device)
    return (positions * (tokens != PAD)).amax(dim=1).clamp(min=1)


def real_positions(tokens: torch.Tensor) -> torch.Tensor:
    """(batch, max_len) booleans: True up to each sequence's length, False on its trailing padding."""
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    return positions.unsqueeze(0) < sequence_lengths(tokens).unsqueeze(1)
