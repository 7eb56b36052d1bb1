"""TVM for the runtime, imported with torch hidden (unless either is already imported).

tvm_ffi imports torch whenever it is installed (for its torch-tensor conversions): about
200 MB of resident memory and a second of start-up in every serving process, though the
runtime hands TVM only numpy arrays and TVM tensors. A later ``import torch`` (xgrammar's
token bitmask, transformers in tests) still works; only tvm_ffi's torch conversions stay off.
"""

import sys

if "tvm_ffi" not in sys.modules and "torch" not in sys.modules:
    sys.modules["torch"] = None                    # makes tvm_ffi's `import torch` fail softly
    try:
        import tvm
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]
else:
    import tvm

__all__ = ["tvm"]
