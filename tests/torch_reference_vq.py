"""PyTorch reference VQ tokenizers: LlamaGen's VQ-16
(`tokenizer/tokenizer_image/vq_model.py`) and the taming VQGAN Chameleon uses,
for parity tests. `TorchVQ` and `randomize_` exist only when torch imports.

See `tests/torch_reference.py` for the guarded torch import.
"""

from __future__ import annotations

import numpy as np

from tests.torch_reference import F, HAVE_TORCH, nn, torch  # pylint: disable=g-multiple-import


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
