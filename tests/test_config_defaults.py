"""configs/ against what the documentation states: the main command's defaults that
README.md and docs/results.md name, the LlamaGen preset's sampling (LlamaGen's
sample_c2i_ddp.py defaults), and the family config against the configs the shipped
bundle's manifest records."""

import json
import pathlib
import re

from absl.testing import absltest

from specdec_jax.configs import family as family_config
from specdec_jax.configs import generate as generate_config
from specdec_jax.configs import sample_llamagen_c2i

REPO = pathlib.Path(__file__).resolve().parents[1]


class ReadmeHeaderTest(absltest.TestCase):

  def test_the_results_header_names_the_default_sampling_and_image_count(self):
    """README "Results": "The main command on the bundled family (CFG 2.0; quality over 100
    images, ..., Jacobi fresh drafts from the left neighbour"."""
    config = generate_config.get_config()
    readme = ' '.join((REPO / 'README.md').read_text().split())
    found = re.search(r'The main command on the bundled family \(CFG (\S+); quality over (\d+) '
                      r'images', readme)
    self.assertIsNotNone(found)
    self.assertEqual(float(found.group(1)), config.sampling.cfg_scale)
    self.assertEqual(int(found.group(2)), config.images_per_class * 10)  # 10 classes
    self.assertIn('Jacobi fresh drafts from the left neighbour', readme)
    self.assertEqual(config.jacobi_init, 'spatial')

  def test_the_results_page_names_the_default_passes(self):
    """docs/results.md "The main command": quality over "10 images of every class (CFG 2.0,
    temperature 1, no top-k), one image per decode call"; latency "for every class, after
    compilation: 8 rounds"; README's table labels EAGLE-2 "lossless" and counts SCD and
    SJD-PAC among "the lossless methods"."""
    config = generate_config.get_config()
    text = ' '.join((REPO / 'docs' / 'results.md').read_text().split())
    found = re.search(r'\*\*quality\*\*: (\d+) images of every class \(CFG (\S+), temperature '
                      r'(\S+), no top-k\), one image per decode call', text)
    self.assertIsNotNone(found)
    self.assertEqual(int(found.group(1)), config.images_per_class)
    self.assertEqual(float(found.group(2)), config.sampling.cfg_scale)
    self.assertEqual(float(found.group(3)), config.sampling.temperature)
    self.assertEqual((config.sampling.top_k, config.quality_batch), (0, 1))
    found = re.search(r'for every class, after compilation: (\d+) rounds', text)
    self.assertIsNotNone(found)
    self.assertEqual(int(found.group(1)), config.timing_repeats)
    self.assertEqual(tuple(config.latency_classes), tuple(range(10)))
    self.assertEqual((config.eagle2_rule, config.scd_rule, config.sjd_pac_rule),
                     ('lossless',) * 3)


class PresetTest(absltest.TestCase):

  def test_llamagen_preset_samples_as_llamagen_sample_c2i_ddp(self):
    """Its docstring: "Sampling defaults are those of LlamaGen's sample_c2i_ddp.py (CFG 1.5,
    no top-k)": argparse defaults cfg-scale 1.5, cfg-interval -1, temperature 1.0, top-k 0,
    top-p 1.0, num-fid-samples 50000."""
    config = sample_llamagen_c2i.get_config()
    self.assertEqual(config.sampling.to_dict(), dict(cfg_scale=1.5, cfg_interval=-1,
                                                     temperature=1.0, top_k=0, top_p=1.0))
    self.assertEqual(config.num_images, 50_000)

  def test_the_main_command_runs_the_documented_methods_in_order(self):
    """The 13 rows of README's results table, in its order (written out here)."""
    self.assertEqual(generate_config.get_config().methods,
                     ('vanilla', 'vanilla_seed1', 'eagle', 'draft_model', 'lantern_pp', 'uniform',
                      'coolsd', 'eagle2', 'sjd', 'scd', 'sjd_pac', 'gsd', 'csd'))


class FamilyConfigTest(absltest.TestCase):

  def test_the_family_config_is_the_one_the_shipped_bundle_was_trained_with(self):
    manifest = json.loads((REPO / 'specdec_jax' / 'assets' / 'fashion_mnist' /
                           'manifest.json').read_text())
    config = family_config.get_config()
    for stage in ('tokenizer', 'target', 'draft_gpt', 'eagle'):
      mine = json.loads(json.dumps(config[stage].to_dict()))
      if stage == 'tokenizer':  # fitted before `init` existed (the manifest's notes)
        mine.pop('init')
      self.assertEqual(mine, manifest[stage]['config'], stage)


if __name__ == '__main__':
  absltest.main()
