"""Sampling an ImageNet evaluation set (50,000 images, 50 per class) from LlamaGen c2i.

  python -m specdec_jax.sample --config configs/sample_llamagen_c2i.py \
      --config.model.checkpoint=ckpts/gpt_xl_c2i --config.model.vq=ckpts/vq \
      --config.model.eagle=ckpts/drafter --config.out_dir=samples/xl_coolsd

The checkpoint and tokenizer are converted folders (README, "Models and
converters"); `eagle` (an EAGLE/LANTERN drafter) and `draft_model` (a small
LlamaGen c2i GPT) are needed only by the methods that draft with them.
Sampling defaults are those of LlamaGen's sample_c2i_ddp.py (CFG 1.5, no
top-k); LlamaGen's own script draws random classes, this job takes every
class in turn.
"""

from specdec_jax.configs import sample_fashion


def get_config():
  config = sample_fashion.get_config()
  config.model.kind = 'llamagen'
  config.model.checkpoint = 'ckpts/gpt_xl_c2i'
  config.model.vq = 'ckpts/vq'
  config.method = 'coolsd'
  config.sampling.cfg_scale = 1.5
  config.sampling.top_k = 0
  config.num_images = 50_000
  config.batch_per_device = 16
  config.chunk_size = 512
  config.out_dir = 'samples/llamagen_c2i'
  return config
