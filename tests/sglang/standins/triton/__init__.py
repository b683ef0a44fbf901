"""Stand-in for `triton` (the real wheel is ~1 GB and needs a GPU): SGLang's modules import
it at module level for their kernels; the conformance tests never compile or launch one."""

import sys

from _inert import make_inert

__version__ = "3.5.0"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


make_inert(sys.modules[__name__])
