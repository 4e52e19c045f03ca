"""The rebuilt BERT directories the model tests use; the builder lives in the package
(``aioengine.hub.onnx_rebuild``) so that the ``embed`` bench suite can use its reranker too."""

from aioengine.hub.onnx_rebuild import (  # noqa: F401
    WHEEL,
    bge_small_dir,
    dequantized_weights,
    msmarco_reranker_dir,
)
