"""specdec_jax.app.host: the CPU a run's JSON records."""

from unittest import mock

from absl.testing import absltest

from specdec_jax.app import host

XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu avx avx2 avx512f amx_bf16 amx_tile
processor\t: 1
model name\t: another CPU
flags\t\t: fpu
"""
EPYC = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu avx avx2 avx512f avx512_bf16
"""


class DescribeTest(absltest.TestCase):

  def describe(self, cpuinfo: str) -> dict:
    with mock.patch('builtins.open', mock.mock_open(read_data=cpuinfo)):
      return host.describe()

  def test_reads_the_first_processors_name_and_vector_extensions(self):
    xeon, epyc = self.describe(XEON), self.describe(EPYC)
    self.assertEqual(xeon['cpu'], 'Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz')
    self.assertEqual((xeon['avx2'], xeon['avx512'], xeon['amx']), (True, True, True))
    self.assertEqual(epyc['cpu'], 'AMD EPYC 9B14')
    self.assertEqual((epyc['avx2'], epyc['avx512'], epyc['amx']), (True, True, False))

  def test_unreadable_cpuinfo_gives_empty_fields(self):
    with mock.patch('builtins.open', side_effect=OSError('no /proc')):
      described = host.describe()
    self.assertEqual(described['cpu'], '')
    self.assertFalse(any(described[name] for name in host.VECTOR_FLAGS))

  def test_this_machine_is_described(self):
    described = host.describe()
    self.assertGreater(described['cores'], 0)
    self.assertEqual(set(described), {'cpu', 'cores', *host.VECTOR_FLAGS})


if __name__ == '__main__':
  absltest.main()
