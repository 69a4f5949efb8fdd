"""PyTorch reference of LlamaGen's GPT (FoundationVision/LlamaGen
`autoregressive/models/gpt.py`), for parity tests.

See `tests/torch_reference.py` for the guarded torch import.
"""

from __future__ import annotations

from tests.torch_reference import (  # pylint: disable=g-multiple-import
    F, as_long, as_torch, as_torch_state, rms, rope_2d_table, rotate_pairs,
    swiglu, torch)


# -------------------------------------------------------------- LlamaGen ---


def gpt_forward(sd, config, cond, idx, emb_mask=None):
  """LlamaGen GPT.forward in training mode: logits [B, M + 1, V] (torch).

  Args:
    sd: original key layout.
    config: `models.llamagen.GPTConfig`.
    cond: class ids [B] (c2i) or caption features [B, P, C] (t2i).
    idx: image tokens [B, M].
    emb_mask: t2i caption mask [B, P] (None: no masking).
  """
  sd = as_torch_state(sd)
  cond, idx = as_torch(cond), as_long(idx)
  if config.model_type == 'c2i':
    cond = as_long(cond)
  emb_mask = None if emb_mask is None else as_torch(emb_mask)
  c = config
  if c.model_type == 'c2i':
    cond_embeds = sd['cls_embedding.embedding_table.weight'][cond][:, None]
  else:
    hidden = cond @ sd['cls_embedding.cap_proj.fc1.weight'].T
    cond_embeds = F.gelu(hidden, approximate='tanh') @ sd['cls_embedding.cap_proj.fc2.weight'].T
  x = torch.cat([cond_embeds, sd['tok_embeddings.weight'][idx]], dim=1)
  batch, length, _ = x.shape
  cos, sin = rope_2d_table(c.grid_size, c.head_dim, c.rope_base, c.cls_token_num)
  cos, sin = cos[:length], sin[:length]
  mask = torch.tril(torch.ones(length, length, dtype=torch.bool)).expand(batch, -1, -1).clone()
  if emb_mask is not None:
    mask[:, :, : c.cls_token_num] &= emb_mask[:, None, :].bool()
    mask |= torch.eye(length, dtype=torch.bool)[None]
  hd, q_rows = c.head_dim, c.n_head * c.head_dim
  for i in range(c.n_layer):
    p = f'layers.{i}.'
    h = rms(x, sd[p + 'attention_norm.weight'], c.norm_eps)
    qkv = h @ sd[p + 'attention.wqkv.weight'].T
    q, k, v = qkv.split([q_rows, c.n_kv_head * hd, c.n_kv_head * hd], dim=-1)
    q = rotate_pairs(q.reshape(batch, length, c.n_head, hd), cos, sin)
    k = rotate_pairs(k.reshape(batch, length, c.n_kv_head, hd), cos, sin)
    v = v.reshape(batch, length, c.n_kv_head, hd)
    # Grouped-query attention: each k/v head serves n_head / n_kv_head query heads in turn.
    k, v = (t.repeat_interleave(c.n_head // c.n_kv_head, dim=2) for t in (k, v))
    attn = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None])
    x = x + attn.transpose(1, 2).reshape(batch, length, -1) @ sd[p + 'attention.wo.weight'].T
    h = rms(x, sd[p + 'ffn_norm.weight'], c.norm_eps)
    x = x + swiglu(h, sd[p + 'feed_forward.w1.weight'], sd[p + 'feed_forward.w3.weight'],
                   sd[p + 'feed_forward.w2.weight'])
  logits = (rms(x, sd['norm.weight'], c.norm_eps) @ sd['output.weight'].T).float()
  return logits[:, c.cls_token_num - 1:]


def greedy_cfg(sd, config, labels, cfg_scale):
  """LlamaGen greedy CFG generation by full recomputation (c2i) -> int [B, N]."""
  labels = as_long(labels)
  null = torch.full_like(labels, config.num_classes)
  cond = torch.cat([labels, null])
  tokens = torch.zeros(2 * len(labels), 0, dtype=torch.long)
  for _ in range(config.block_size):
    logits = gpt_forward(sd, config, cond, tokens)[:, -1]
    cond_logits, uncond_logits = logits.chunk(2)
    nxt = (uncond_logits + (cond_logits - uncond_logits) * cfg_scale).argmax(-1)
    tokens = torch.cat([tokens, torch.cat([nxt, nxt])[:, None]], dim=1)
  return tokens[: len(labels)].numpy()
