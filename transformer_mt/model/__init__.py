"""The Transformer, one concept per module as the paper names them."""

from .transformer import Transformer, build_model, count_parameters

__all__ = ["Transformer", "build_model", "count_parameters"]
