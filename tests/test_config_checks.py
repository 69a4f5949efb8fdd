"""The main command's and the sampler's config checks at their edges (pinned by a
mutation audit): bounds and the methods tuple."""

import re
import tempfile
import types

from absl.testing import absltest

from specdec_jax.app import cli
from specdec_jax.app import config_checks
from specdec_jax.app import generate
from specdec_jax.app import sample
from specdec_jax.configs import generate as generate_config
from specdec_jax.configs import sample_fashion

# What check_for_family reads of a family: 16 tokens per image, 32 codes, 10 classes.
FAMILY = types.SimpleNamespace(num_tokens=16, num_classes=10,
                               target=types.SimpleNamespace(vocab_size=32))


class ConfigChecksTest(absltest.TestCase):

  def test_methods_must_start_with_vanilla_and_be_distinct(self):
    """vanilla is the speed and quality reference (methods[0] in latency_pass and
    evaluate): another first method, or one listed twice, is refused."""
    for methods in (('eagle', 'vanilla'), ('vanilla', 'eagle', 'eagle'), ('vanilla', 'vanilla'),
                    ()):
      config = generate_config.get_config()
      config.methods = methods
      with self.assertRaisesRegex(cli.ConfigError, r"config.methods=.*'vanilla' first"):
        generate.check_config(config)
    config = generate_config.get_config()
    config.methods = ('vanilla', 'eagle')
    generate.check_config(config)

  def test_guidance_below_one_is_refused(self):
    """cfg_scale's documented range is >= 1.0 (1.0 = no guidance), for both commands."""
    config = generate_config.get_config()
    config.sampling.cfg_scale = 0.5
    with self.assertRaisesRegex(cli.ConfigError, r'config.sampling.cfg_scale=0.5: must be a '
                                r'finite number >= 1.0'):
      generate.check_config(config)
    config.sampling.cfg_scale = 1.0
    generate.check_config(config)
    sampler = sample_fashion.get_config()
    sampler.sampling.cfg_scale = 0.5
    with self.assertRaisesRegex(cli.ConfigError, 'config.sampling.cfg_scale=0.5'):
      cli.check_fields(sampler, sample.CONFIG_CHECKS)

  def test_negative_classes_are_refused(self):
    """cli.integers(0): a class id below 0 (the sampler's classes, the main command's
    latency_classes) is refused before any model loads."""
    sampler = sample_fashion.get_config()
    sampler.classes = (3, -1)
    with self.assertRaisesRegex(cli.ConfigError, r'config.classes=\(3, -1\): must be a tuple '
                                'of integers >= 0'):
      cli.check_fields(sampler, sample.CONFIG_CHECKS)
    config = generate_config.get_config()
    config.latency_classes = (-1,)
    with self.assertRaisesRegex(cli.ConfigError, 'config.latency_classes='):
      generate.check_config(config)

  def test_latency_classes_must_be_classes_of_the_family(self):
    config = generate_config.get_config()
    config.latency_classes = (0, FAMILY.num_classes)
    with self.assertRaisesRegex(cli.ConfigError, r'config.latency_classes has \[10\], outside '
                                r'\[0, 10\)'):
      generate.check_config(config, FAMILY)
    config.latency_classes = (0, FAMILY.num_classes - 1)
    generate.check_config(config, FAMILY)

  def test_a_bundle_dir_that_is_not_a_bundle_is_a_config_error(self):
    """A --config.bundle_dir without the bundle's parts is refused by check_config
    (exit 2 with the message), not by the loader's FileNotFoundError later."""
    with tempfile.TemporaryDirectory() as tmp:
      config = generate_config.get_config()
      config.bundle_dir = tmp
      with self.assertRaisesRegex(cli.ConfigError, f"config.bundle_dir='{tmp}' is not a "
                                  'complete model bundle'):
        generate.check_config(config)

  def test_a_jacobi_window_of_the_whole_image_is_accepted(self):
    """jacobi_window may be the tokens per image (at most L); L + 1 is refused."""
    config = generate_config.get_config()
    config.jacobi_window = FAMILY.num_tokens
    config_checks.check_for_family(config, FAMILY, 'config', config.methods)
    config.jacobi_window = FAMILY.num_tokens + 1
    with self.assertRaisesRegex(cli.ConfigError, 'config.jacobi_window=17: must be at most '
                                'the 16 tokens per image'):
      config_checks.check_for_family(config, FAMILY, 'config', config.methods)

  def test_values_at_the_edge_of_each_range_are_refused(self):
    """The first value outside each documented range: top_p 0 (no token could be
    kept; the range is (0, 1]), a TV threshold above 1 (the TV distance is at most
    1), a Jacobi window of 1 (nothing left to verify beyond the next token), a COOL-SD
    delta of 0 (it scales the target's probability), an infinite or NaN CFG scale;
    the value just inside each range passes."""
    for field, refused, accepted, words in (
        ('sampling.top_p', 0.0, 1e-3, 'a finite number > 0.0 and <= 1.0'),
        ('sampling.cfg_scale', float('inf'), 1.0, 'a finite number >= 1.0'),
        ('sampling.cfg_scale', float('nan'), 1.0, 'a finite number >= 1.0'),
        ('csd_tv_threshold', 1.5, 1.0, 'a finite number >= 0.0 and <= 1.0'),
        ('jacobi_window', 1, 2, 'an integer >= 2'),
        ('coolsd_delta', 0.0, 1e-3, 'a finite number > 0.0')):
      config = generate_config.get_config()
      group, _, name = field.rpartition('.')
      fields = config[group] if group else config
      fields[name] = refused
      with self.assertRaisesRegex(cli.ConfigError,
                                  f'config.{field}={refused!r}: must be {re.escape(words)}'):
        generate.check_config(config)
      fields[name] = accepted
      generate.check_config(config)

  def test_empty_latency_classes_are_refused(self):
    config = generate_config.get_config()
    config.latency_classes = ()
    with self.assertRaisesRegex(cli.ConfigError, r'config.latency_classes=\(\)'):
      generate.check_config(config)

  def test_without_methods_every_method_is_checked(self):
    """methods=None (the default) means all methods: SJD-PAC's tree must lie inside the
    Jacobi window even when no method list is given."""
    config = generate_config.get_config()
    config.jacobi_window, config.pac_depth = 4, 4
    config_checks.check_for_family(config, FAMILY, 'config', ('vanilla', 'sjd'))  # no PAC
    with self.assertRaisesRegex(cli.ConfigError, 'config.pac_depth=4'):
      config_checks.check_for_family(config, FAMILY, 'config')

  def test_eagle2_top_k_may_be_the_vocabulary_size_but_not_more(self):
    """A node has at most V children: eagle2_top_k = V passes with the family, V + 1
    is refused naming the vocabulary."""
    config = generate_config.get_config()
    vocab = FAMILY.target.vocab_size
    config.eagle2_top_k = vocab
    config_checks.check_for_family(config, FAMILY, 'config', config.methods)
    config.eagle2_top_k = vocab + 1
    with self.assertRaisesRegex(cli.ConfigError, f'config.eagle2_top_k={vocab + 1}: must be at '
                                f'most the vocabulary size {vocab}'):
      config_checks.check_for_family(config, FAMILY, 'config', config.methods)


if __name__ == '__main__':
  absltest.main()
