"""Reading traces: :func:`load_trace` and the node/tensor records it returns."""

from .load import Trace, find_trace_json, load_trace
from .model import Node, TensorRecord

__all__ = ["load_trace", "find_trace_json", "Trace", "Node", "TensorRecord"]
