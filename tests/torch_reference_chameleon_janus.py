"""PyTorch reference forwards of Hugging Face Chameleon (as Lumina-mGPT runs it)
and the Janus-Pro generation path (deepseek-ai/Janus), for parity tests.

See `tests/torch_reference.py` for the guarded torch import.
"""

from __future__ import annotations

from tests.torch_reference import (  # pylint: disable=g-multiple-import
    F, apply_rope_half, as_long, as_torch_state, causal_bias, rms, rope_1d,
    swiglu, torch)


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
