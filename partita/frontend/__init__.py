"""Frontends: turn models from other frameworks into partita graphs.

- ``partita.frontend.torch_export.import_torch``: a PyTorch module, through ``torch.export``.
- ``partita.frontend.onnx``: an ONNX model.

Nothing is imported eagerly here, so ``import partita`` loads neither torch nor onnx.
"""

from __future__ import annotations

from ..ir.diagnostics import PartitaError


class FrontendError(PartitaError):
    """A model could not be imported: unsupported ops (all of them, each with its source
    line), a type the importer disagrees with, or a module feature the frontend lacks."""
