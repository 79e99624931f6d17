"""gnnio: IO-aware graph neural network layers on GPUs.

The package has one core shared by the CLI and the library:

- ``gnnio_cli.graph``: the immutable :class:`Graph` (CSR by target, CSC by
  source) and everything that makes or changes one (readers, the HDF5 store,
  generators, reordering, degree profiles);
- ``gnnio_cli.ops``: functional ops, one module per kernel family, each with a
  pure-PyTorch reference and a dispatch to the native CUDA kernels;
- ``gnnio_cli.nn``: drop-in replacements for PyTorch Geometric's layers;
- ``gnnio_cli.bench``: timing, peak memory and the byte-floor model;
- ``gnnio_cli.cli``: the ``gnnio`` command.
"""

__version__ = "0.1.0"

from gnnio_cli.errors import GnnioError  # noqa: E402
from gnnio_cli.graph import Graph  # noqa: E402

__all__ = ["Graph", "GnnioError", "__version__"]
