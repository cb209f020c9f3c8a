"""tmt: train an English-Italian translation Transformer end to end."""

__version__ = "0.1.0"
