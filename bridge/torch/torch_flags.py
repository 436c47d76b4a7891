# SPDX-License-Identifier: Apache-2.0
"""Prints what compiling against the importable torch needs, for meson.build: the
_GLIBCXX_USE_CXX11_ABI value, then the include directories, then the library
directories (each list ';'-separated, one per line). Exits 1 when torch does not import."""
import sys

try:
    import torch
    from torch.utils import cpp_extension
except Exception as e:  # any failure to import means: no torch here
    print(f"torch does not import: {e}", file=sys.stderr)
    sys.exit(1)


def _call(fn):
    # torch >= 2.6 takes device_type=, older releases cuda=True. Without a CUDA_HOME torch
    # can find, the CPU list: meson.build adds the toolkit's include directory itself.
    for kwargs in ({"device_type": "cuda"}, {"cuda": True}, {}):
        try:
            return fn(**kwargs)
        except TypeError:
            continue
        except OSError:
            return fn()
    return fn()


print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(";".join(_call(cpp_extension.include_paths)))
print(";".join(_call(cpp_extension.library_paths)))
