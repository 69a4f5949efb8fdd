"""app.cli: check tables, unknown --config.x, and how the entry points print configuration errors."""

import os
import pathlib
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import ml_collections

from specdec_jax.app import cli
from specdec_jax.app import files

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_entry_point(module: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
  """`python -m module args` on CPU, with the compilation cache kept out of ~/.cache."""
  with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, JAX_PLATFORMS='cpu', XDG_CACHE_HOME=cache)
    return subprocess.run([sys.executable, '-m', module, *args], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=300)


class CheckFieldsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.checks = dict(count=cli.integer(1), scale=cli.number(above=0.0, note='1 = none'),
                       kind=cli.one_of('a', 'b'), sub=dict(flag=cli.BOOL))

  def config(self, **changes):
    config = ml_collections.ConfigDict(dict(count=2, scale=1.0, kind='a', sub=dict(flag=True)))
    config.update(changes)
    return config

  def test_a_valid_config_passes(self):
    cli.check_fields(self.config(), self.checks)

  def test_each_refusal_names_the_field_the_value_and_what_it_accepts(self):
    cases = [(dict(count=0), 'config.count=0: must be an integer >= 1'),
             (dict(count=True), 'config.count=True: must be an integer >= 1'),
             (dict(scale=float('nan')), r'config.scale=nan: must be a finite number > 0.0 '
                                         r'\(1 = none\)'),
             # A strict bound refuses the bound itself; no bound admits infinity.
             (dict(scale=0.0), r'config.scale=0.0: must be a finite number > 0.0'),
             (dict(scale=float('inf')), r'config.scale=inf: must be a finite number > 0.0'),
             (dict(kind='c'), r"config.kind='c': must be one of \('a', 'b'\)"),
             (dict(sub=dict(flag=1)), 'config.sub.flag=1: must be True or False')]
    for changes, message in cases:
      config = self.config()
      config.unlock()
      for key, value in changes.items():
        config[key] = value
      with self.assertRaisesRegex(cli.ConfigError, message):
        cli.check_fields(config, self.checks)

  def test_a_field_the_table_does_not_know_is_refused(self):
    config = self.config()
    config.extra = 1
    with self.assertRaisesRegex(cli.ConfigError, r"does not read: \['extra'\]"):
      cli.check_fields(config, self.checks)


class OverridesTest(absltest.TestCase):

  def test_unknown_fields_are_named_with_the_fields_there_are(self):
    default = str(REPO / 'configs' / 'generate.py')
    cli.check_overrides(['prog', '--config.seed=1', '--config.sampling.top_k=3'], default)
    with self.assertRaisesRegex(cli.ConfigError, r"--config.sedd: config has no field 'sedd'; "
                                'its fields are .*seed'):
      cli.check_overrides(['prog', '--config.sedd=1'], default)
    with self.assertRaisesRegex(cli.ConfigError, r"config.sampling has no field 'topk'.*top_k"):
      cli.check_overrides(['prog', '--config.sampling.topk=3'], default)
    with self.assertRaisesRegex(cli.ConfigError, "config.seed has no field 'x'"):
      cli.check_overrides(['prog', '--config.seed.x=3'], default)
    other = str(REPO / 'configs' / 'sample_llamagen_c2i.py')  # --config names the file
    cli.check_overrides(['prog', '--config', other, '--config.model.vq=v'], default)
    with self.assertRaisesRegex(cli.ConfigError, "config.model has no field 'vae'"):
      cli.check_overrides(['prog', f'--config={other}', '--config.model.vae=v'], default)

  def test_a_config_file_that_does_not_exist_is_named(self):
    default = str(REPO / 'configs' / 'generate.py')
    for argv in (['prog', '--config=absent.py'], ['prog', '--config', 'absent.py:arg'],
                 ['prog', '--config=absent.py', '--config.seed=1']):
      with self.assertRaisesRegex(cli.ConfigError, r"--config 'absent.py.*is not a file.*"
                                  r'leave --config out for the packaged default'):
        cli.check_overrides(argv, default)
    cli.check_overrides(['prog', f'--config={default}:x'], default)  # an argument is allowed


class EntryPointErrorsTest(parameterized.TestCase):
  """Configuration errors print their message alone (exit 2); no traceback."""

  def assert_refused(self, result: subprocess.CompletedProcess, message: str):
    self.assertEqual(result.returncode, cli.EXIT_CONFIG_ERROR, result.stderr[-3000:])
    self.assertIn(message, result.stderr)
    self.assertNotIn('Traceback', result.stderr)

  def test_main_command(self):
    self.assert_refused_before_writing(
        'specdec_jax.generate', '--config.timing_repeats=0', '--out={out}',
        message='config.timing_repeats=0: must be an integer >= 1')
    self.assert_refused(run_entry_point('specdec_jax.generate', '--config.x=1'),
                        "--config.x: config has no field 'x'")
    self.assert_refused(run_entry_point('specdec_jax.generate', '--config=absent.py'),
                        "--config 'absent.py': 'absent.py' is not a file")

  def test_main_command_arguments_and_output_folder(self):
    """A word that is not a flag (a mistyped --out) is refused, not ignored; so is an
    empty --out; a folder another run holds is refused before any work."""
    self.assert_refused_before_writing(
        'specdec_jax.generate', 'myout', '--out={out}',
        message="unexpected argument(s) ['myout']: this command takes flags only")
    self.assert_refused(run_entry_point('specdec_jax.generate', '--out='),
                        "--out='': an empty name")
    self.assert_refused(run_entry_point('specdec_jax.sample', 'extra'),
                        "unexpected argument(s) ['extra']")
    with tempfile.TemporaryDirectory() as tmp:
      with files.FolderLock(tmp) as lock:  # held by this (live) process
        result = run_entry_point('specdec_jax.generate', f'--out={tmp}')
        self.assert_refused(result, f'{tmp} is in use by another job')
        self.assertIn(f'delete {lock.path}.', result.stderr)  # the main command has no
        self.assertNotIn('break_lock', result.stderr)         # break_lock setting
      self.assertFalse(lock.path.exists())

  def run_interrupted(self, main_body: str, *args: str) -> subprocess.CompletedProcess:
    """Runs `cli.run_command` on a main whose body (lines, ending in a Ctrl-C) is given;
    the script has threading, time, absl.logging and cli imported."""
    script = ('import threading, time; from absl import flags, logging\n'
              'from specdec_jax.app import cli\n'
              f'def main(argv):\n{main_body}'
              'cli.run_command(main, lambda: flags.DEFINE_string("config", None, ""), '
              f'{os.path.join(REPO, "configs", "generate.py")!r})')
    result = subprocess.run([sys.executable, '-c', script, *args], cwd=REPO,
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, JAX_PLATFORMS='cpu'))
    self.assertEqual(result.returncode, cli.EXIT_INTERRUPTED, result.stderr[-2000:])
    return result

  def test_ctrl_c_is_one_line_with_status_130(self):
    result = self.run_interrupted('  raise KeyboardInterrupt\n')
    self.assertEqual(result.stderr.strip(), 'interrupted (Ctrl-C)')

  def test_ctrl_c_does_not_wait_for_a_busy_thread(self):
    """A thread still in a call no signal stops (a compiled XLA call in the main
    command's thread pool) would hold sys.exit until it returns; the interrupted
    command exits at once, with status 130 and its log flushed."""
    result = self.run_interrupted(
        '  threading.Thread(target=threading.Event().wait,  # never returns\n'
        '                   name=cli.DROPPED_ON_INTERRUPT + "_0").start()\n'
        '  logging.info("decoding")\n'
        '  raise KeyboardInterrupt\n', '--alsologtostderr')
    self.assertIn('decoding', result.stderr)
    self.assertTrue(result.stderr.endswith('interrupted (Ctrl-C)\n'), result.stderr[-2000:])

  def test_ctrl_c_waits_for_other_threads(self):
    """Threads the command does not drop (an Orbax checkpoint commit) are waited for
    as sys.exit does: the interrupted command exits once that thread ends."""
    result = self.run_interrupted(
        '  def commit(): time.sleep(1); print("committed", flush=True)\n'
        '  threading.Thread(target=commit).start()\n'
        '  raise KeyboardInterrupt\n')
    self.assertEqual(result.stdout, 'committed\n')

  def test_sampler(self):
    self.assert_refused_before_writing(
        'specdec_jax.sample', '--config.num_images=0', '--config.out_dir={out}',
        message='config.num_images=0: must be an integer >= 1')
    self.assert_refused(run_entry_point('specdec_jax.sample', '--config.hparams.k=2'),
                        "config.hparams has no field 'k'")

  def test_family_trainer(self):
    self.assert_refused_before_writing(
        'specdec_jax.app.train.family', '--workdir={out}', "--config.stages=('tokenizer','vae')",
        message="config.stages has unknown names ['vae']")
    self.assert_refused(run_entry_point('specdec_jax.app.train.family', '--config.target.lrr=1'),
                        "config.target has no field 'lrr'")

  @parameterized.parameters(
      (('--workdir=',), "--workdir='': must name the output folder"),
      (('--config.tokenizer.data_dir={out}/absent',), 'Fashion-MNIST not found in'),
      (("--config.stages=('eagle',)",), "stage eagle reads the outputs of ['tokenizer', "
       "'target'], which are missing"),
      (('--config.target.model.n_head=3',), 'config.target.model makes no GPT: GPTConfig: dim '
       '64 must be divisible by n_head 3'),
  )
  def test_family_trainer_refusals(self, args, message):
    """Tracebacks (exit 1) that left an empty workdir behind."""
    self.assert_refused_before_writing('specdec_jax.app.train.family', '--workdir={out}', *args,
                                       message=message)

  @parameterized.parameters(('classifier', '--config.data_dir={junk}'),
                            ('kmeans_tokenizer', '--config.data_dir={junk}'),
                            ('family', '--config.tokenizer.data_dir={junk}'))
  def test_corrupt_data_files_are_refused(self, name, arg):
    with tempfile.TemporaryDirectory() as junk:
      for path in ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
                   't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'):
        pathlib.Path(junk, path).write_bytes(b'junk')
      self.assert_refused_before_writing(
          f'specdec_jax.app.train.{name}', '--workdir={out}', arg.replace('{junk}', junk),
          message='train-images-idx3-ubyte.gz does not match the SHA-256 of the official file')

  @parameterized.parameters(('gpt', '--config.tokens_path={out}/absent.npz'),
                            ('family', "--config.stages=('eagle',)"))
  def test_a_workdir_in_use_is_refused_naming_its_holder(self, name, arg):
    """Two runs on one workdir mixed their checkpoints (the second crashed in orbax)."""
    with tempfile.TemporaryDirectory() as out:
      lock = files.FolderLock(out)
      lock.acquire()
      result = run_entry_point(f'specdec_jax.app.train.{name}', f'--workdir={out}',
                               arg.format(out=out))
      self.assert_refused(result, f'{out} is in use by another job: {lock.path} is held by '
                          f'pid {os.getpid()}')
      self.assertNotIn('break_lock', result.stderr)  # trainers have no such flag
      self.assertEqual(files._read_holder(lock.path), lock.holder)  # still ours
      lock.release()
      # Free again: the run is refused for what it reads, and releases the lock.
      self.assert_refused(run_entry_point(f'specdec_jax.app.train.{name}', f'--workdir={out}',
                                          arg.format(out=out)), '')
      self.assertEqual(os.listdir(out), [])

  def test_a_family_run_and_a_trainer_on_one_of_its_stages_refuse_each_other(self):
    """The family locks its workdir, not each stage's folder: a trainer run on a stage
    folder during a family run (or the reverse) trained beside it into one folder."""
    with tempfile.TemporaryDirectory() as out:
      with files.FolderLock(out) as family_lock:  # a family run (this process, alive)
        stage = os.path.join(out, 'target')
        result = run_entry_point('specdec_jax.app.train.gpt', f'--workdir={stage}',
                                 f'--config.tokens_path={out}/absent.npz')
        self.assert_refused(result, f'--workdir={stage} lies in {out}: {out} is in use by '
                            f'another job: {family_lock.path} is held by pid {os.getpid()}')
        self.assertFalse(os.path.exists(stage))
      stage = os.path.join(out, 'tokenizer')
      with files.FolderLock(stage) as trainer_lock:  # a trainer on one stage's folder
        result = run_entry_point('specdec_jax.app.train.family', f'--workdir={out}')
        self.assert_refused(result, f'{stage} is in use by another job: {trainer_lock.path} '
                            f'is held by pid {os.getpid()}')
        self.assertEqual(sorted(os.listdir(out)), ['tokenizer'])  # the family's lock is gone
        self.assertEqual(os.listdir(stage), ['job.lock'])

  def test_family_trainer_workdir_that_is_a_file(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'a_file')
      open(path, 'w').close()
      self.assert_refused(run_entry_point('specdec_jax.app.train.family', f'--workdir={path}'),
                          'is a file, not a folder')

  @parameterized.parameters(
      ('gpt', ('--config.num_stepz=3',), "--config.num_stepz: config has no field 'num_stepz'"),
      ('kmeans_tokenizer', ('--config.iterations=-1',),
       'config.iterations=-1: must be an integer >= 1'),
      ('classifier', ('--config.learning_rate=0',), 'config.learning_rate=0.0: must be a finite '
       'number > 0.0'),
      ('gpt', ('--config.tokens_path={out}/absent.npz',), 'train a tokenizer first'),
      ('drafter', ('--config.target_dir={out}/absent',), 'train the target first'),
      ('vq', ('--config.data_dir={out}/absent',), 'Fashion-MNIST not found'),
      ('drafter', ('--config.data_source=targett',), "config.data_source must be one of "
       "('dataset', 'target'), got 'targett'"),
      ('kmeans_tokenizer', ('--config.num_patches=10', '--config.codebook_size=16'),
       'config.num_patches=10 is below config.codebook_size=16'),
      ('kmeans_tokenizer', ('--workdir=',), "--workdir='': must name the output folder"),
      ('gpt', ('--config.model.dim=63',),
       'config.model makes no GPT: GPTConfig: dim 63 must be divisible by n_head 2'),
      ('gpt', ('--config.model.n_layer=0',), 'config.model.n_layer=0: must be an integer >= 1'),
      ('gpt', ('--config.num_classes=0',), 'config.num_classes=0: must be an integer >= 1'),
      ('gpt', ('--config.tokens_path=README.md',), "tokens file 'README.md' is not a tokens.npz"),
      ('vq', ('--config.vq.norm_groups=7',), 'config.vq makes no tokenizer: VQConfig: channel'),
  )
  def test_trainers(self, name, args, message):
    self.assert_refused_before_writing(f'specdec_jax.app.train.{name}', '--workdir={out}',
                                       *args, message=message)

  @parameterized.parameters(
      ('specdec_jax.generate', ('--outt=x',), "Unknown command line flag 'outt'"),
      ('specdec_jax.generate', ('--config.images_per_class=abc',),
       'flag --config.images_per_class=abc: invalid literal'),
      ('specdec_jax.sample', ('--distributed=maybe',), 'flag --distributed=maybe'),
      ('specdec_jax.app.train.gpt', (), 'Flag --workdir must have a value other than None'),
      ('specdec_jax.converters.vq', ('--input=x.pt', '--output=out'),
       'Flag --kind must have a value other than None'),
  )
  def test_bad_flags_are_usage_errors(self, module, args, message):
    """absl printed these with a usage hint and exit status 1; every command says
    exit status 2 for a bad flag."""
    self.assert_refused(run_entry_point(module, *args), message)

  def test_a_converter_refusal_is_one_line(self):
    result = run_entry_point('specdec_jax.converters.vq', '--input=x.pt', '--output=out')
    self.assert_refused(result, 'Flag --kind must have a value other than None')
    self.assertLen(result.stderr.strip().splitlines(), 1, result.stderr)

  def test_trainer_help_lists_its_flags(self):
    result = run_entry_point('specdec_jax.app.train.drafter', '--help')
    self.assertIn('--config: Training configuration', result.stdout + result.stderr)
    self.assertIn('set one with --config.<field>=<value>', result.stdout)
    self.assertIn('\n  num_steps = ', result.stdout)  # the config's fields, with values
    self.assertIn('--workdir: Output folder', result.stdout + result.stderr)
    self.assertEqual(result.returncode, 0)

  @parameterized.parameters(('specdec_jax.generate', '--help', '--out: '),
                            ('specdec_jax.generate', '--help', '\n  sampling.cfg_scale = 2.0'),
                            ('specdec_jax.sample', '--helpfull', '--config: '),
                            ('specdec_jax.sample', '--help', '\n  num_images = '),
                            ('specdec_jax.converters.vq', '--help', '--kind: '))
  def test_help_exits_with_status_0(self, module, flag, listed):
    """absl's help flags exit with status 1, which scripts read as a failure."""
    result = run_entry_point(module, flag)
    self.assertIn(listed, result.stdout)
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])

  def test_the_console_script_shows_the_main_commands_help_and_refusals(self):
    """`specdec-generate` (pyproject's [project.scripts]) calls generate.run: absl lists
    the flags of the program's module, so it must run the module as the program."""
    with tempfile.TemporaryDirectory() as cache:
      env = dict(os.environ, JAX_PLATFORMS='cpu', XDG_CACHE_HOME=cache)
      script = 'from specdec_jax.app.generate import run; run()'
      for flag, code, listed in (('--help', 0, '--out: Folder for PNG grids'),
                                 ('--config.bogus=1', 2, "config has no field 'bogus'")):
        result = subprocess.run([sys.executable, '-c', script, flag], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=300)
        with self.subTest(flag):
          self.assertIn(listed, result.stdout + result.stderr)
          self.assertEqual(result.returncode, code, result.stderr[-2000:])
          self.assertNotIn('RuntimeWarning', result.stderr)

  def assert_refused_before_writing(self, module: str, *args: str, message: str):
    """Refused with `message`, and the output folder ({out} in args) not created."""
    with tempfile.TemporaryDirectory() as tmp:
      out = os.path.join(tmp, 'out')
      self.assert_refused(run_entry_point(module, *(a.format(out=out) for a in args)), message)
      self.assertFalse(os.path.exists(out))

if __name__ == '__main__':
  absltest.main()
