"""Shared pieces of the verify_chain / verify_tree Monte Carlo tests.
"""


import flax.struct
import jax.numpy as jnp

from specdec_jax import rules


NUM_SAMPLES = 2 ** 16


@flax.struct.dataclass
class AcceptEverything(rules.Rule):
  """Negative control: f = 1 (what a verifier that skips the test does)."""

  def accept_prob(self, draft_probs, target_probs, position=1):
    return jnp.ones_like(draft_probs)
