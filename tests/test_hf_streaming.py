"""Tests for converters/hf_streaming.py: index validation and shard-by-shard reading.

Everything but the `.bin` shards runs without torch: test checkpoints are
written from numpy arrays by `hf_streaming.write_sharded_safetensors`.
"""

import json
import os
import pathlib
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.converters import chameleon as chameleon_converter
from specdec_jax.converters import hf_streaming
from specdec_jax.converters import janus as janus_converter
from tests import torch_reference as ref


def _tensors():
  rng = np.random.default_rng(0)
  return {
      'a.weight': rng.standard_normal((6, 4)).astype(np.float32),
      'b.weight': rng.standard_normal(5).astype(jnp.bfloat16),
      'c.weight': rng.standard_normal((3, 7)).astype(np.float16),
      'd.bias': rng.standard_normal(8).astype(np.float32),
  }


class HFStreamingTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = self._tempdir()
    self.tensors = _tensors()

  def _tempdir(self):
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    return pathlib.Path(tmp.name)

  def _write(self, max_shard_bytes=64):
    return hf_streaming.write_sharded_safetensors(
        self.tensors.items(), self.dir, max_shard_bytes=max_shard_bytes)

  def _index(self):
    with open(self.dir / hf_streaming.SAFETENSORS_INDEX) as f:
      return json.load(f)

  def test_reads_every_tensor_exactly_shard_by_shard(self):
    shards = self._write()
    self.assertGreater(len(shards), 1)
    ckpt = hf_streaming.open_checkpoint(self.dir)
    self.assertEqual(ckpt.kind, 'safetensors')
    self.assertEqual(ckpt.shapes(), {k: tuple(v.shape) for k, v in self.tensors.items()})
    seen_shards = []
    for name, array in hf_streaming.iter_tensors(ckpt):
      seen_shards.append(ckpt.tensors[name].shard)
      expected = self.tensors[name]
      self.assertEqual(array.dtype, expected.dtype)
      np.testing.assert_array_equal(array, expected)
    # Shards are visited in order, each once.
    self.assertEqual(seen_shards, sorted(seen_shards))
    self.assertEqual(len(seen_shards), len(self.tensors))

  def test_files_list_every_shard_and_the_index(self):
    """Converters hash `ckpt.files` into their provenance: the index is one of them
    (pinned by a mutation audit, as the next two)."""
    self._write()
    ckpt = hf_streaming.open_checkpoint(self.dir)
    self.assertIsNotNone(ckpt.index_file)
    self.assertGreater(len(ckpt.shards), 1)
    self.assertEqual(sorted(ckpt.files),
                     sorted([self.dir / s for s in ckpt.shards] + [ckpt.index_file]))

  def test_dtype_casts_floating_tensors_only(self):
    self.tensors['e.ids'] = np.arange(5, dtype=np.int32) * 100003
    self._write()
    ckpt = hf_streaming.open_checkpoint(self.dir)
    rules = {'a.weight': (('dense', 'kernel'), hf_streaming.identity),
             'e.ids': (('buffers', 'ids'), hf_streaming.identity)}
    params = hf_streaming.assemble_params(ckpt, rules, dtype='bfloat16')
    self.assertEqual(params['dense']['kernel'].dtype.name, 'bfloat16')
    self.assertEqual(params['buffers']['ids'].dtype, np.int32)
    np.testing.assert_array_equal(np.asarray(params['buffers']['ids']), self.tensors['e.ids'])

  def test_safetensors_win_over_a_bin_checkpoint_beside_them(self):
    """Hub folders often ship both formats; the safetensors index is read (no torch,
    no pickle), whatever else lies there."""
    self._write()
    (self.dir / hf_streaming.TORCH_SINGLE).write_bytes(b'not a torch file')
    ckpt = hf_streaming.open_checkpoint(self.dir)
    self.assertEqual(ckpt.kind, 'safetensors')
    self.assertEqual(ckpt.index_file, self.dir / hf_streaming.SAFETENSORS_INDEX)
    self.assertEqual(set(ckpt.tensors), set(self.tensors))

  def test_single_file_and_keep_filter(self):
    hf_streaming.write_safetensors(self.dir / 'model.safetensors', self.tensors)
    ckpt = hf_streaming.open_checkpoint(self.dir)
    self.assertIsNone(ckpt.index_file)
    names = [n for n, _ in hf_streaming.iter_tensors(ckpt, keep=lambda n: n.endswith('bias'))]
    self.assertEqual(names, ['d.bias'])

  @ref.requires_torch
  def test_torch_bin_shards_with_index(self):
    names = list(self.tensors)
    weight_map = {}
    for k, group in enumerate((names[:2], names[2:])):
      shard = f'pytorch_model-{k + 1:05d}-of-00002.bin'
      ref.torch.save({n: ref.as_torch(self.tensors[n]) for n in group}, self.dir / shard)
      weight_map.update({n: shard for n in group})
    with open(self.dir / hf_streaming.TORCH_INDEX, 'w') as f:
      json.dump({'weight_map': weight_map}, f)
    ckpt = hf_streaming.open_checkpoint(self.dir)
    self.assertEqual(ckpt.kind, 'torch')
    got = dict(hf_streaming.iter_tensors(ckpt))
    for name, array in self.tensors.items():
      self.assertEqual(got[name].dtype, array.dtype)
      np.testing.assert_array_equal(got[name], array)

  def test_missing_shard_is_named(self):
    shards = self._write()
    os.remove(shards[-1])
    with self.assertRaisesRegex(hf_streaming.ShardIndexError,
                                f'missing.*{shards[-1].name}'):
      hf_streaming.open_checkpoint(self.dir)

  def test_tensor_listed_but_absent_from_its_shard(self):
    self._write()
    index = self._index()
    index['weight_map']['ghost.weight'] = index['weight_map']['a.weight']
    with open(self.dir / hf_streaming.SAFETENSORS_INDEX, 'w') as f:
      json.dump(index, f)
    with self.assertRaisesRegex(hf_streaming.ShardIndexError,
                                r'1 tensor\(s\) listed for it are not in the file: ghost.weight'):
      hf_streaming.open_checkpoint(self.dir)

  def test_shard_with_tensor_not_in_index(self):
    self._write()
    index = self._index()
    del index['weight_map']['c.weight']  # shares its shard with b.weight
    with open(self.dir / hf_streaming.SAFETENSORS_INDEX, 'w') as f:
      json.dump(index, f)
    with self.assertRaisesRegex(hf_streaming.ShardIndexError,
                                r'in the file are not listed for it: c.weight'):
      hf_streaming.open_checkpoint(self.dir)

  def test_truncated_shard(self):
    shards = self._write()
    data = shards[0].read_bytes()
    shards[0].write_bytes(data[:-8])
    with self.assertRaisesRegex(hf_streaming.ShardIndexError, 'truncated'):
      hf_streaming.open_checkpoint(self.dir)

  def test_config_json_errors_name_the_file(self):
    path = self.dir / 'config.json'
    for text, message in (('{"vocab_size": 65536', 'is not valid JSON'),
                          ('[1, 2]', 'must hold a JSON object, got list')):
      path.write_text(text)
      for converter in (chameleon_converter, janus_converter):
        with self.assertRaisesRegex(ValueError, f"config.json'? {message}"):
          converter.resolve_config(None, self.dir)

  def test_header_entries_are_checked(self):
    """Offsets spanning fewer bytes than dtype x shape (a read would run into the next
    tensor), an unknown dtype code or missing offsets: a ShardIndexError naming the
    tensor, before any data is read."""
    def write(header, data):
      encoded = json.dumps(header).encode()
      encoded += b' ' * (-len(encoded) % 8)
      path = self.dir / hf_streaming.SAFETENSORS_SINGLE
      path.write_bytes(len(encoded).to_bytes(8, 'little') + encoded + data)
      return path

    data = np.arange(8, dtype=np.float32).tobytes()
    good = {'a': {'dtype': 'F32', 'shape': [4], 'data_offsets': [0, 16]},
            'b': {'dtype': 'F32', 'shape': [4], 'data_offsets': [16, 32]}}
    infos = hf_streaming.read_safetensors_header(write(good, data))
    self.assertEqual(infos['a'].shape, (4,))
    for entry, message in (
        ({'dtype': 'F32', 'shape': [8], 'data_offsets': [0, 16]},
         r"tensor 'a' \(F32\[8\], 32 bytes\) has data_offsets \[0, 16\] \(16 bytes\)"),
        ({'dtype': 'F8_E4M3', 'shape': [4], 'data_offsets': [0, 16]},
         r"header entry of tensor 'a' is malformed.*needs dtype in"),
        ({'dtype': 'F32', 'shape': [4]}, r"header entry of tensor 'a' is malformed")):
      path = write(dict(good, a=entry), data)
      with self.assertRaisesRegex(hf_streaming.ShardIndexError, message):
        hf_streaming.read_safetensors_header(path)
    # Two tensors over the same bytes (each entry right on its own), and a header
    # that is JSON but no object.
    overlapping = dict(good, b={'dtype': 'F32', 'shape': [4], 'data_offsets': [8, 24]})
    with self.assertRaisesRegex(hf_streaming.ShardIndexError,
                                r"tensors 'a' and 'b' share data bytes \(one ends at 16, "
                                r'the other starts at 8\)'):
      hf_streaming.read_safetensors_header(write(overlapping, data))
    empty = dict(good, e={'dtype': 'F32', 'shape': [0], 'data_offsets': [8, 8]})
    self.assertLen(hf_streaming.read_safetensors_header(write(empty, data)), 3)
    with self.assertRaisesRegex(hf_streaming.ShardIndexError, 'its header is a JSON list'):
      hf_streaming.read_safetensors_header(write([], data))

  def test_an_index_naming_shards_as_dot_slash_names_reads_them(self):
    self._write()
    index = self._index()
    index['weight_map'] = {k: f'./{v}' for k, v in index['weight_map'].items()}
    with open(self.dir / hf_streaming.SAFETENSORS_INDEX, 'w') as f:
      json.dump(index, f)
    ckpt = hf_streaming.open_checkpoint(self.dir)
    got = dict(hf_streaming.iter_tensors(ckpt))
    np.testing.assert_array_equal(got['a.weight'], self.tensors['a.weight'])

  def test_an_index_that_is_no_map_of_plain_file_names_is_named(self):
    shards = self._write()
    for weight_map, message in (
        (['a.weight'], r'"weight_map" is a list, not an object'),
        ({'a.weight': f'sub/{shards[0].name}'}, r'shard files outside its own folder: sub/'),
        ({'a.weight': f'../{shards[0].name}'}, r'outside its own folder: \.\./'),
        ({'a.weight': 3}, r'values must be shard file names \(strings\), got 3 \(int\)')):
      with self.subTest(weight_map=weight_map):
        with open(self.dir / hf_streaming.SAFETENSORS_INDEX, 'w') as f:
          json.dump({'weight_map': weight_map}, f)
        with self.assertRaisesRegex(hf_streaming.ShardIndexError, message):
          hf_streaming.open_checkpoint(self.dir)

  def test_no_checkpoint_in_folder(self):
    with self.assertRaisesRegex(hf_streaming.ShardIndexError, 'No checkpoint'):
      hf_streaming.open_checkpoint(self.dir)

  def test_assemble_params_transposes_casts_and_nests(self):
    self._write()
    ckpt = hf_streaming.open_checkpoint(self.dir)
    rules = {'a.weight': (('dense', 'kernel'), hf_streaming.transpose),
             'b.weight': (('norm', 'weight'), hf_streaming.identity)}
    params = hf_streaming.assemble_params(ckpt, rules, dtype='float32')
    self.assertEqual(set(params), {'dense', 'norm'})
    np.testing.assert_array_equal(params['dense']['kernel'], self.tensors['a.weight'].T)
    self.assertEqual(params['norm']['weight'].dtype, np.float32)
    # Leaves are jax arrays on the host (Orbax writes them without another copy).
    self.assertIsInstance(params['dense']['kernel'], jax.Array)
    self.assertEqual(params['dense']['kernel'].devices(), {jax.devices('cpu')[0]})
    clash = dict(rules, **{'d.bias': (('norm', 'weight'), hf_streaming.identity)})
    with self.assertRaisesRegex(ValueError, 'two source tensors map to norm/weight'):
      hf_streaming.assemble_params(ckpt, clash)  # one would silently win

  def test_assemble_params_places_tensors_in_the_given_sharding(self):
    self._write()
    ckpt = hf_streaming.open_checkpoint(self.dir)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('data', 'model'))
    shardings = {}

    def sharding(path, shape):
      spec = jax.sharding.PartitionSpec(None, 'model') if len(shape) == 2 else None
      shardings[path] = jax.sharding.NamedSharding(mesh, spec or jax.sharding.PartitionSpec())
      return shardings[path]

    rules = {'a.weight': (('dense', 'kernel'), hf_streaming.transpose),
             'd.bias': (('dense', 'bias'), hf_streaming.identity)}
    params = hf_streaming.assemble_params(ckpt, rules, sharding=sharding)
    self.assertEqual(params['dense']['kernel'].sharding, shardings[('dense', 'kernel')])
    self.assertEqual(params['dense']['bias'].sharding, shardings[('dense', 'bias')])

  def test_sharding_from_engine_rules(self):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('data', 'model'))
    place = hf_streaming.sharding_from_rules(mesh)
    spec = lambda path, shape: place(path, shape).spec
    self.assertEqual(spec(('model', 'layers_0', 'self_attn', 'q_proj', 'kernel'), (4, 4)),
                     jax.sharding.PartitionSpec(None, 'model'))
    self.assertEqual(spec(('model', 'layers_0', 'mlp', 'down', 'kernel'), (4, 4)),
                     jax.sharding.PartitionSpec('model', None))
    self.assertEqual(spec(('model', 'norm', 'weight'), (4,)), jax.sharding.PartitionSpec(None))

  def test_written_files_are_standard_safetensors(self):
    # Header, dtype codes, offsets and padding as the safetensors format
    # defines them: the reference reader (when installed) reads every tensor.
    tensors = dict(self.tensors, i=np.arange(5, dtype=np.int64),
                   empty=np.zeros((0, 3), np.float32), flag=np.array([True, False]))
    path = self.dir / 'one.safetensors'
    hf_streaming.write_safetensors(path, tensors, metadata={'format': 'pt'})
    (header_len,) = np.frombuffer(path.read_bytes()[:8], '<u8')
    self.assertEqual(header_len % 8, 0)
    infos = hf_streaming.read_safetensors_header(path)
    got = hf_streaming.read_safetensors_tensors(path, infos, ['c.weight', 'i'])
    self.assertEqual(set(got), {'c.weight', 'i'})  # only what was asked for
    np.testing.assert_array_equal(got['i'], tensors['i'])
    self.assertEqual(infos['b.weight'].dtype, 'bfloat16')
    if ref.HAVE_TORCH:
      import safetensors.torch  # pylint: disable=g-import-not-at-top
      loaded = safetensors.torch.load_file(str(path))
      self.assertEqual(set(loaded), set(tensors))
      for name, array in tensors.items():
        np.testing.assert_array_equal(
            np.asarray(loaded[name].float() if name == 'b.weight' else loaded[name]),
            array.astype(np.float32) if name == 'b.weight' else array)

  @ref.requires_torch
  def test_torch_tensors_are_written_too(self):
    tensors = {name: ref.as_torch(array) for name, array in self.tensors.items()}
    hf_streaming.write_sharded_safetensors(tensors.items(), self.dir, max_shard_bytes=64)
    got = dict(hf_streaming.iter_tensors(hf_streaming.open_checkpoint(self.dir)))
    for name, array in self.tensors.items():
      self.assertEqual(got[name].dtype, array.dtype)
      np.testing.assert_array_equal(got[name], array)

  def test_failed_conversion_writes_nothing(self):
    shards = self._write()
    os.remove(shards[0])
    out_parent = self._tempdir()
    with self.assertRaises(hf_streaming.ShardIndexError):
      chameleon_converter.convert(self.dir, out_parent / 'out', config='7b')
    self.assertEqual(list(out_parent.iterdir()), [])


if __name__ == '__main__':
  absltest.main()
