"""A small CNN classifier used only for evaluation (class accuracy, Frechet distance).

Legend: B images, H = W = 28 (the family's images), C = 1 channel, F = 128 feature width.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class Classifier(nn.Module):
  """2x conv(32) -> pool -> 2x conv(64) -> pool -> flatten -> F -> classes.

  `__call__` returns (logits [B, num_classes], features [B, F]); the features
  (the penultimate layer) are the space the Frechet distance is computed in.
  """

  num_classes: int = 10
  feature_dim: int = 128

  @nn.compact
  def __call__(self, images: jax.Array, train: bool = False):
    """images: uint8 or float [B, H, W, C]; uint8 is scaled to [-1, 1]."""
    x = images.astype(jnp.float32)
    if images.dtype == jnp.uint8:
      x = x / 127.5 - 1.0
    for width in (32, 64):
      x = nn.relu(nn.Conv(width, (3, 3))(x))
      x = nn.relu(nn.Conv(width, (3, 3))(x))
      x = nn.max_pool(x, (2, 2), (2, 2))
    x = x.reshape(x.shape[0], -1)
    features = nn.relu(nn.Dense(self.feature_dim)(x))
    return nn.Dense(self.num_classes)(features), features
