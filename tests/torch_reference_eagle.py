"""PyTorch reference of the LANTERN / EAGLE-1 drafters (jadohu/LANTERN), for
parity tests.

See `tests/torch_reference.py` for the guarded torch import.
"""

from __future__ import annotations

from tests.torch_reference import (  # pylint: disable=g-multiple-import
    F, apply_rope_half, as_long, as_torch, as_torch_state, rms, rope_1d,
    rope_2d_table, rotate_pairs, swiglu, torch)


# --------------------------------------------------- EAGLE-1 / LANTERN ---


def drafter_forward(sd, cfg_json, kind, head_weight, tokens, hidden, grid=24, cls_token_num=0,
                    mask=None):
  """LANTERN drafter: tokens [B, L], hidden [B, L, E] -> (logits, features) numpy.

  fc on [embedding, target feature], the decoder layers (LlamaGen: no input
  norm in layer 0, interleaved 2D RoPE with LANTERN's table, by default input_type c2i's
  (grid 24, no condition rows; t2i: grid 16, 119); Lumina: input norm, per-head
  q/k LayerNorm, rotate_half 1D RoPE), no final norm, the target's head.

  mask: optional bool [B, L] (Lumina), False on left padding: as LANTERN's
  drafter call, positions are mask.cumsum - 1 and padded keys are not attended.
  """
  sd = as_torch_state(sd)
  head_weight, tokens, hidden = as_torch(head_weight), as_long(tokens), as_torch(hidden)
  e, heads = cfg_json['hidden_size'], cfg_json['num_attention_heads']
  hd, eps = e // heads, cfg_json['rms_norm_eps']
  x = torch.cat([sd['embed_tokens.weight'][tokens], hidden], -1) @ sd['fc.weight'].T + sd['fc.bias']
  batch, length, _ = x.shape
  positions = torch.arange(length)
  keys = torch.ones(batch, length, dtype=torch.bool) if mask is None else as_torch(mask).bool()
  row_positions = (keys.long().cumsum(-1) - 1).clamp(min=0)  # [B, L]
  for i in range(cfg_json.get('num_hidden_layers', 1)):  # EAGLE: layer 0 without input norm
    p = f'layers.{i}.'
    h = rms(x, sd[p + 'input_layernorm.weight'], eps) if kind == 'lumina' or i else x
    q, k, v = (h @ sd[p + f'self_attn.{n}_proj.weight'].T for n in 'qkv')
    q, k, v = (t.reshape(batch, length, heads, hd) for t in (q, k, v))
    if kind == 'lumina':
      norm = lambda t, n: (F.layer_norm(t, (hd,), eps=1e-5) * sd[p + f'self_attn.{n}.weight']
                           + sd[p + f'self_attn.{n}.bias'])
      q, k = norm(q, 'q_norm'), norm(k, 'k_norm')
      cos, sin = (t.reshape(batch, length, hd)[:, :, None, :] for t in
                  rope_1d(row_positions.reshape(-1), hd, cfg_json['rope_theta']))
      q, k = apply_rope_half(q, cos, sin), apply_rope_half(k, cos, sin)
    else:
      cos, sin = rope_2d_table(grid, hd, cfg_json['rope_theta'], cls_token_num, trailing_zeros=10)
      q = rotate_pairs(q, cos[positions], sin[positions])
      k = rotate_pairs(k, cos[positions], sin[positions])
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
    eye = torch.eye(length, dtype=torch.bool)
    visible = causal[None] & (keys[:, None, :] | eye[None])  # a padded query sees itself
    attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=visible[:, None])
    x = x + attn.transpose(1, 2).reshape(batch, length, e) @ sd[p + 'self_attn.o_proj.weight'].T
    h = rms(x, sd[p + 'post_attention_layernorm.weight'], eps)
    x = x + swiglu(h, sd[p + 'mlp.gate_proj.weight'], sd[p + 'mlp.up_proj.weight'],
                   sd[p + 'mlp.down_proj.weight'])
  return (x @ head_weight.T).numpy(), x.numpy()
