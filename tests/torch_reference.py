"""PyTorch reference forwards of the original architectures, for parity tests.

Each forward is written from the original papers and repositories, not from
the Flax ports: LlamaGen's GPT and VQ (FoundationVision/LlamaGen
`autoregressive/models/gpt.py`, `tokenizer/tokenizer_image/vq_model.py`),
Hugging Face Chameleon as Lumina-mGPT runs it (Alpha-VLLM/Lumina-mGPT), the
taming VQGAN Chameleon uses, the Janus-Pro generation path
(deepseek-ai/Janus `janus/models/modeling_vlm.py`) and the LANTERN / EAGLE-1
drafters (jadohu/LANTERN).

torch is optional. Without it this module still imports, `HAVE_TORCH` is
False, and test classes or methods decorated with `requires_torch` are
skipped, so every test module collects and its torch-free tests run. State
dicts passed in may hold numpy arrays or torch tensors (`as_torch`).
"""

from __future__ import annotations

import unittest
from collections.abc import Mapping
from typing import Any

import numpy as np

try:
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
except ImportError:  # the torch extra is not installed
  torch = nn = F = None

HAVE_TORCH = torch is not None
requires_torch = unittest.skipUnless(
    HAVE_TORCH, 'needs torch for the PyTorch reference or torch files '
    '(pip install "specdec-jax[torch]")')


def as_torch(value: Any):
  """numpy array -> torch tensor (shares memory, bf16 included); torch tensors pass through."""
  if isinstance(value, np.ndarray):
    value = np.ascontiguousarray(value)
    if value.dtype.name == 'bfloat16':  # ml_dtypes bf16: reinterpret the bits
      return torch.from_numpy(value.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(value)
  return value


def as_torch_state(state: Mapping[str, Any]) -> dict[str, Any]:
  return {k: as_torch(v) for k, v in state.items()}


def as_long(ids: Any):
  """Token ids (list, numpy or torch) -> int64 torch tensor."""
  if isinstance(ids, torch.Tensor):
    return ids.long()
  return torch.from_numpy(np.asarray(ids, np.int64))


# ------------------------------------------------------- shared pieces ---


def rms(x, weight, eps):
  """RMSNorm computed in float32: weight * x / sqrt(mean(x^2) + eps)."""
  normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
  return normed.type_as(x) * weight


def rotate_half(x):
  """HF Llama's rotate_half over the last axis: [x1, x2] -> [-x2, x1]."""
  half = x.shape[-1] // 2
  return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope_1d(positions, head_dim, theta):
  """HF Llama RoPE tables (cos, sin) [L, D] for integer positions [L]."""
  inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
  freqs = positions.float()[:, None] * inv_freq[None, :]
  emb = torch.cat([freqs, freqs], dim=-1)
  return emb.cos(), emb.sin()


def apply_rope_half(x, cos, sin):
  """x [B, H, L, D] with cos/sin [L, D]: x cos + rotate_half(x) sin."""
  return x * cos + rotate_half(x) * sin


def causal_bias(length):
  """[L, L] additive mask: 0 on and below the diagonal, -inf above."""
  return torch.full((length, length), float('-inf')).triu(1)


def swiglu(x, gate_w, up_w, down_w):
  return (F.silu(x @ gate_w.T) * (x @ up_w.T)) @ down_w.T


# ----------------------------------------------- Chameleon / Lumina-mGPT ---


def chameleon_logits(state, hf, ids):
  """HF Chameleon forward (eager attention) -> float32 logits [B, L, V] (numpy).

  Args:
    state: HF key layout; q/k norm params (heads, D) or (1, D), or
      (model_parallel_size, D), each row repeated over its heads as
      Lumina-mGPT's ChameleonLayerNorm does.
    hf: the config.json fields (hidden_size, heads, ..., swin_norm).
    ids: int64 token ids [B, L] (numpy or torch).
  """
  state = as_torch_state(state)
  ids = as_long(ids)
  e = hf['hidden_size']
  heads, kv_heads = hf['num_attention_heads'], hf['num_key_value_heads']
  d, eps = e // heads, hf['rms_norm_eps']
  batch, length = ids.shape
  cos, sin = rope_1d(torch.arange(length), d, hf['rope_theta'])
  causal = causal_bias(length)

  def head_norm(x, weight, bias, num_heads):
    repeats = num_heads // weight.shape[0]
    weight, bias = weight.repeat_interleave(repeats, 0), bias.repeat_interleave(repeats, 0)
    return F.layer_norm(x, (d,), eps=1e-5) * weight + bias

  def attention(x, p):
    q = (x @ state[p + 'q_proj.weight'].T).view(batch, length, heads, d)
    k = (x @ state[p + 'k_proj.weight'].T).view(batch, length, kv_heads, d)
    v = (x @ state[p + 'v_proj.weight'].T).view(batch, length, kv_heads, d)
    q = head_norm(q, state[p + 'q_norm.weight'], state[p + 'q_norm.bias'], heads)
    k = head_norm(k, state[p + 'k_norm.weight'], state[p + 'k_norm.bias'], kv_heads)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, L, D]
    q, k = apply_rope_half(q, cos, sin), apply_rope_half(k, cos, sin)
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    weights = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5 + causal, dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(batch, length, e)
    return out @ state[p + 'o_proj.weight'].T

  def mlp(x, p):
    return swiglu(x, state[p + 'gate_proj.weight'], state[p + 'up_proj.weight'],
                  state[p + 'down_proj.weight'])

  x = state['model.embed_tokens.weight'][ids]
  for i in range(hf['num_hidden_layers']):
    p = f'model.layers.{i}.'
    in_norm = state[p + 'input_layernorm.weight']
    post_norm = state[p + 'post_attention_layernorm.weight']
    if hf['swin_norm']:
      x = x + rms(attention(x, p + 'self_attn.'), in_norm, eps)
      x = x + rms(mlp(x, p + 'mlp.'), post_norm, eps)
    else:
      x = x + attention(rms(x, in_norm, eps), p + 'self_attn.')
      x = x + mlp(rms(x, post_norm, eps), p + 'mlp.')
  x = rms(x, state['model.norm.weight'], eps)
  return (x @ state['lm_head.weight'].T).float().numpy()


# ---------------------------------------------------------------- Janus ---


def janus_logits(state, lm, prompt_ids, image_ids, *, eps=1e-6, theta=10000.0):
  """Janus-Pro generation path -> float32 image logits [B, P + N, V] (numpy).

  Text prompt through the Llama embedding, image tokens through
  gen_embed -> gen_aligner (exact GELU), HF Llama blocks, final norm,
  gen_head (exact GELU).

  Args:
    state: original DeepSeek key layout.
    lm: the language_config fields (hidden_size, num_attention_heads,
      num_hidden_layers).
    prompt_ids, image_ids: int64 [B, P] and [B, N] (numpy or torch).
  """
  state = as_torch_state(state)
  prompt_ids, image_ids = as_long(prompt_ids), as_long(image_ids)
  e, heads = lm['hidden_size'], lm['num_attention_heads']
  d = e // heads
  prefix = 'language_model.model.'
  text = state[prefix + 'embed_tokens.weight'][prompt_ids]
  image = state['gen_embed.weight'][image_ids]
  image = F.gelu(image @ state['gen_aligner.layers.0.weight'].T
                 + state['gen_aligner.layers.0.bias'])
  image = image @ state['gen_aligner.layers.2.weight'].T + state['gen_aligner.layers.2.bias']
  x = torch.cat([text, image], dim=1)
  batch, length, _ = x.shape
  cos, sin = rope_1d(torch.arange(length), d, theta)
  causal = causal_bias(length)
  for i in range(lm['num_hidden_layers']):
    p = f'{prefix}layers.{i}.'
    h = rms(x, state[p + 'input_layernorm.weight'], eps)
    q, k, v = ((h @ state[p + f'self_attn.{n}_proj.weight'].T)
               .view(batch, length, heads, d).transpose(1, 2) for n in 'qkv')
    q, k = apply_rope_half(q, cos, sin), apply_rope_half(k, cos, sin)
    weights = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5 + causal, dim=-1)
    attn = (weights @ v).transpose(1, 2).reshape(batch, length, e)
    x = x + attn @ state[p + 'self_attn.o_proj.weight'].T
    h = rms(x, state[p + 'post_attention_layernorm.weight'], eps)
    x = x + swiglu(h, state[p + 'mlp.gate_proj.weight'], state[p + 'mlp.up_proj.weight'],
                   state[p + 'mlp.down_proj.weight'])
  h = rms(x, state[prefix + 'norm.weight'], eps)
  h = F.gelu(h @ state['gen_head.output_mlp_projector.weight'].T
             + state['gen_head.output_mlp_projector.bias'])
  logits = h @ state['gen_head.vision_head.weight'].T + state['gen_head.vision_head.bias']
  return logits.float().numpy()


# -------------------------------------------------------------- LlamaGen ---


def rope_2d_table(grid, head_dim, base, cls_token_num, trailing_zeros=0):
  """LlamaGen's 2D RoPE angles as (cos, sin) [P + G*G + Z, D/2].

  Zero rows (no rotation) for the P condition tokens and, as in LANTERN's
  drafter table, Z rows after the grid.
  """
  half = head_dim // 2
  freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
  per_axis = torch.outer(torch.arange(grid, dtype=torch.float32), freqs)  # [G, D/4]
  angles = torch.cat([per_axis[:, None, :].expand(grid, grid, -1),     # row
                      per_axis[None, :, :].expand(grid, grid, -1)],    # column
                     dim=-1).reshape(grid * grid, half)
  front, back = torch.zeros(cls_token_num, half), torch.zeros(trailing_zeros, half)
  return (torch.cat([front, angles.cos(), back]), torch.cat([front, angles.sin(), back]))


def rotate_pairs(x, cos, sin):
  """Interleaved-pair rotation; x [B, L, H, D], cos/sin [L, D/2]."""
  pairs = x.float().reshape(*x.shape[:-1], -1, 2)
  x0, x1 = pairs[..., 0], pairs[..., 1]
  c, s = cos[None, :, None, :], sin[None, :, None, :]
  return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], -1).flatten(3).type_as(x)


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


# --------------------------------------------------- EAGLE-1 / LANTERN ---


def drafter_forward(sd, cfg_json, kind, head_weight, tokens, hidden):
  """LANTERN drafter: tokens [B, L], hidden [B, L, E] -> (logits, features) numpy.

  fc on [embedding, target feature], one decoder layer (LlamaGen: no input
  norm, interleaved 2D RoPE with LANTERN's table for input_type c2i; Lumina:
  input norm, per-head q/k LayerNorm, rotate_half 1D RoPE), no final norm,
  the target's head.
  """
  sd = as_torch_state(sd)
  head_weight, tokens, hidden = as_torch(head_weight), as_long(tokens), as_torch(hidden)
  e, heads = cfg_json['hidden_size'], cfg_json['num_attention_heads']
  hd, eps = e // heads, cfg_json['rms_norm_eps']
  x = torch.cat([sd['embed_tokens.weight'][tokens], hidden], -1) @ sd['fc.weight'].T + sd['fc.bias']
  batch, length, _ = x.shape
  positions = torch.arange(length)
  p = 'layers.0.'
  h = rms(x, sd[p + 'input_layernorm.weight'], eps) if kind == 'lumina' else x
  q, k, v = (h @ sd[p + f'self_attn.{n}_proj.weight'].T for n in 'qkv')
  q, k, v = (t.reshape(batch, length, heads, hd) for t in (q, k, v))
  if kind == 'lumina':
    norm = lambda t, n: (F.layer_norm(t, (hd,), eps=1e-5) * sd[p + f'self_attn.{n}.weight']
                         + sd[p + f'self_attn.{n}.bias'])
    q, k = norm(q, 'q_norm'), norm(k, 'k_norm')
    cos, sin = rope_1d(positions, hd, cfg_json['rope_theta'])
    q = apply_rope_half(q, cos[None, :, None, :], sin[None, :, None, :])
    k = apply_rope_half(k, cos[None, :, None, :], sin[None, :, None, :])
  else:
    cos, sin = rope_2d_table(24, hd, cfg_json['rope_theta'], 0, trailing_zeros=10)
    q = rotate_pairs(q, cos[positions], sin[positions])
    k = rotate_pairs(k, cos[positions], sin[positions])
  causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
  attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                        attn_mask=causal)
  x = x + attn.transpose(1, 2).reshape(batch, length, e) @ sd[p + 'self_attn.o_proj.weight'].T
  h = rms(x, sd[p + 'post_attention_layernorm.weight'], eps)
  x = x + swiglu(h, sd[p + 'mlp.gate_proj.weight'], sd[p + 'mlp.up_proj.weight'],
                 sd[p + 'mlp.down_proj.weight'])
  return (x @ head_weight.T).numpy(), x.numpy()


# ------------------------------------------------------------------ VQ ---

if HAVE_TORCH:

  def swish(x):
    return x * torch.sigmoid(x)

  def group_norm(channels):
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)

  class ResnetBlock(nn.Module):

    def __init__(self, cin, cout):
      super().__init__()
      self.norm1 = group_norm(cin)
      self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
      self.norm2 = group_norm(cout)
      self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
      if cin != cout:
        self.nin_shortcut = nn.Conv2d(cin, cout, 1, 1, 0)

    def forward(self, x):
      h = self.conv1(swish(self.norm1(x)))
      h = self.conv2(swish(self.norm2(h)))
      if hasattr(self, 'nin_shortcut'):
        x = self.nin_shortcut(x)
      return x + h

  class AttnBlock(nn.Module):

    def __init__(self, channels):
      super().__init__()
      self.norm = group_norm(channels)
      self.q = nn.Conv2d(channels, channels, 1)
      self.k = nn.Conv2d(channels, channels, 1)
      self.v = nn.Conv2d(channels, channels, 1)
      self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x):
      h = self.norm(x)
      q, k, v = self.q(h), self.k(h), self.v(h)
      b, c, height, width = q.shape
      q = q.reshape(b, c, height * width).permute(0, 2, 1)  # b, hw, c
      k = k.reshape(b, c, height * width)  # b, c, hw
      weights = torch.softmax(torch.bmm(q, k) * (int(c) ** -0.5), dim=2)
      out = torch.bmm(v.reshape(b, c, height * width), weights.permute(0, 2, 1))
      return x + self.proj_out(out.reshape(b, c, height, width))

  class Downsample(nn.Module):

    def __init__(self, channels):
      super().__init__()
      self.conv = nn.Conv2d(channels, channels, 3, 2, 0)

    def forward(self, x):
      return self.conv(F.pad(x, (0, 1, 0, 1), mode='constant', value=0))

  class Upsample(nn.Module):

    def __init__(self, channels):
      super().__init__()
      self.conv = nn.Conv2d(channels, channels, 3, 1, 1)

    def forward(self, x):
      return self.conv(F.interpolate(x, scale_factor=2.0, mode='nearest'))

  class LlamaGenEncoder(nn.Module):
    """LlamaGen names: conv_blocks.{i}.res/attn/downsample, mid.{0,1,2}."""

    def __init__(self, ch, ch_mult, num_res_blocks, z_channels, attn_levels, in_channels=3):
      super().__init__()
      self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
      self.conv_blocks = nn.ModuleList()
      block_in = ch
      for level, mult in enumerate(ch_mult):
        block = nn.Module()
        block.res, block.attn = nn.ModuleList(), nn.ModuleList()
        for _ in range(num_res_blocks):
          block.res.append(ResnetBlock(block_in, ch * mult))
          block_in = ch * mult
          if level in attn_levels:
            block.attn.append(AttnBlock(block_in))
        if level != len(ch_mult) - 1:
          block.downsample = Downsample(block_in)
        self.conv_blocks.append(block)
      self.mid = nn.ModuleList([ResnetBlock(block_in, block_in), AttnBlock(block_in),
                                ResnetBlock(block_in, block_in)])
      self.norm_out = group_norm(block_in)
      self.conv_out = nn.Conv2d(block_in, z_channels, 3, 1, 1)

    def forward(self, x):
      h = self.conv_in(x)
      for block in self.conv_blocks:
        for j, res in enumerate(block.res):
          h = res(h)
          if len(block.attn):
            h = block.attn[j](h)
        if hasattr(block, 'downsample'):
          h = block.downsample(h)
      for layer in self.mid:
        h = layer(h)
      return self.conv_out(swish(self.norm_out(h)))

  class LlamaGenDecoder(nn.Module):
    """conv_blocks.{k}: k = 0 is the lowest resolution (ch_mult index n-1)."""

    def __init__(self, ch, ch_mult, num_res_blocks, z_channels, attn_levels, out_channels=3):
      super().__init__()
      block_in = ch * ch_mult[-1]
      self.conv_in = nn.Conv2d(z_channels, block_in, 3, 1, 1)
      self.mid = nn.ModuleList([ResnetBlock(block_in, block_in), AttnBlock(block_in),
                                ResnetBlock(block_in, block_in)])
      self.conv_blocks = nn.ModuleList()
      for level in reversed(range(len(ch_mult))):
        block = nn.Module()
        block.res, block.attn = nn.ModuleList(), nn.ModuleList()
        for _ in range(num_res_blocks + 1):
          block.res.append(ResnetBlock(block_in, ch * ch_mult[level]))
          block_in = ch * ch_mult[level]
          if level in attn_levels:
            block.attn.append(AttnBlock(block_in))
        if level != 0:
          block.upsample = Upsample(block_in)
        self.conv_blocks.append(block)
      self.norm_out = group_norm(block_in)
      self.conv_out = nn.Conv2d(block_in, out_channels, 3, 1, 1)

    def forward(self, z):
      h = self.conv_in(z)
      for layer in self.mid:
        h = layer(h)
      for block in self.conv_blocks:
        for j, res in enumerate(block.res):
          h = res(h)
          if len(block.attn):
            h = block.attn[j](h)
        if hasattr(block, 'upsample'):
          h = block.upsample(h)
      return self.conv_out(swish(self.norm_out(h)))

  class TamingEncoder(nn.Module):
    """Chameleon/taming names: down.{i}.block/attn/downsample, mid.block_1/attn_1/block_2."""

    def __init__(self, ch, ch_mult, num_res_blocks, z_channels, in_channels=3):
      super().__init__()
      self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
      self.down = nn.ModuleList()
      block_in = ch
      for level, mult in enumerate(ch_mult):
        down = nn.Module()
        down.block, down.attn = nn.ModuleList(), nn.ModuleList()  # attn_resolutions = []
        for _ in range(num_res_blocks):
          down.block.append(ResnetBlock(block_in, ch * mult))
          block_in = ch * mult
        if level != len(ch_mult) - 1:
          down.downsample = Downsample(block_in)
        self.down.append(down)
      self.mid = nn.Module()
      self.mid.block_1 = ResnetBlock(block_in, block_in)
      self.mid.attn_1 = AttnBlock(block_in)
      self.mid.block_2 = ResnetBlock(block_in, block_in)
      self.norm_out = group_norm(block_in)
      self.conv_out = nn.Conv2d(block_in, z_channels, 3, 1, 1)  # double_z False

    def forward(self, x):
      h = self.conv_in(x)
      for down in self.down:
        for block in down.block:
          h = block(h)
        if hasattr(down, 'downsample'):
          h = down.downsample(h)
      h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
      return self.conv_out(swish(self.norm_out(h)))

  class TamingDecoder(nn.Module):
    """up.{i} is ch_mult index i; up.{n-1} (lowest resolution) runs first."""

    def __init__(self, ch, ch_mult, num_res_blocks, z_channels, out_channels=3):
      super().__init__()
      block_in = ch * ch_mult[-1]
      self.conv_in = nn.Conv2d(z_channels, block_in, 3, 1, 1)
      self.mid = nn.Module()
      self.mid.block_1 = ResnetBlock(block_in, block_in)
      self.mid.attn_1 = AttnBlock(block_in)
      self.mid.block_2 = ResnetBlock(block_in, block_in)
      self.up = nn.ModuleList()
      for level in reversed(range(len(ch_mult))):
        up = nn.Module()
        up.block, up.attn = nn.ModuleList(), nn.ModuleList()
        for _ in range(num_res_blocks + 1):
          up.block.append(ResnetBlock(block_in, ch * ch_mult[level]))
          block_in = ch * ch_mult[level]
        if level != 0:
          up.upsample = Upsample(block_in)
        self.up.insert(0, up)
      self.norm_out = group_norm(block_in)
      self.conv_out = nn.Conv2d(block_in, out_channels, 3, 1, 1)

    def forward(self, z):
      h = self.conv_in(z)
      h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
      for level in reversed(range(len(self.up))):
        for block in self.up[level].block:
          h = block(h)
        if level != 0:
          h = self.up[level].upsample(h)
      return self.conv_out(swish(self.norm_out(h)))

  class TorchVQ(nn.Module):
    """VQModel: encoder, quant_conv, quantize.embedding, post_quant_conv, decoder."""

    def __init__(self, style, codebook_size, codebook_dim, ch, ch_mult, num_res_blocks,
                 z_channels, attn_levels=()):
      super().__init__()
      self.style = style
      if style == 'llamagen':
        self.encoder = LlamaGenEncoder(ch, ch_mult, num_res_blocks, z_channels, attn_levels)
        self.decoder = LlamaGenDecoder(ch, ch_mult, num_res_blocks, z_channels, attn_levels)
      else:
        self.encoder = TamingEncoder(ch, ch_mult, num_res_blocks, z_channels)
        self.decoder = TamingDecoder(ch, ch_mult, num_res_blocks, z_channels)
      self.quantize = nn.Module()
      self.quantize.embedding = nn.Embedding(codebook_size, codebook_dim)
      if style == 'llamagen':
        self.quantize.register_buffer('codebook_used', torch.zeros(65536))
      self.quant_conv = nn.Conv2d(z_channels, codebook_dim, 1)
      self.post_quant_conv = nn.Conv2d(codebook_dim, z_channels, 1)
      self.l2_norm = style == 'llamagen'

    def table(self):
      weight = self.quantize.embedding.weight
      return F.normalize(weight, p=2, dim=-1) if self.l2_norm else weight

    def encode(self, x):
      """-> (pre-quant latents NCHW, token ids [B, h*w])."""
      latents = self.quant_conv(self.encoder(x))
      z = latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
      if self.l2_norm:
        z = F.normalize(z, p=2, dim=-1)
      table = self.table()
      dist = (torch.sum(z ** 2, dim=1, keepdim=True) + torch.sum(table ** 2, dim=1)
              - 2 * z @ table.t())
      return latents, torch.argmin(dist, dim=1).reshape(x.shape[0], -1)

    def decode_code(self, codes, grid):
      quant = self.table()[codes].reshape(codes.shape[0], *grid, -1).permute(0, 3, 1, 2)
      return self.decoder(self.post_quant_conv(quant))

  def randomize_(module: nn.Module, seed: int) -> None:
    """Random weights everywhere (norm scales around 1) so no key is left at its init."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
      for name, param in module.named_parameters():
        noise = torch.randn(param.shape, generator=gen)
        if 'norm' in name and name.endswith('weight'):
          param.copy_(1.0 + 0.2 * noise)
        elif name.endswith('bias'):
          param.copy_(0.1 * noise)
        elif 'embedding' in name:
          param.copy_(noise)
        else:
          fan_in = param[0].numel()
          param.copy_(noise / np.sqrt(fan_in))
