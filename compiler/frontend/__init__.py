"""Model front ends: turn a model file into a `compiler.graph.Graph`.

`load_onnx(path | bytes | ModelProto, input_shapes=None)` and `from_onnx(model)` import ONNX
(opset 13 and later); failures are `OnnxImportError`s naming the node, op and opset.
"""

from __future__ import annotations

from compiler.frontend.onnx import OnnxImportError, from_onnx, load_onnx, supported_ops

__all__ = ["OnnxImportError", "from_onnx", "load_onnx", "supported_ops"]
