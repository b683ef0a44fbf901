"""Stand-in for `torchvision` (PyPI's build does not install beside CPU torch): SGLang's
multimodal modules import it at module level; the conformance tests run no image code."""

import sys

from _inert import make_inert

__version__ = "0.28.0"

make_inert(sys.modules[__name__])
