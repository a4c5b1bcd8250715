"""Model front-ends: read a model from outside (Hugging Face folders) into an `isa.graph.Graph`."""

from wse_emu.isa.frontends.hf import FrontendError, load_hf

__all__ = ["FrontendError", "load_hf"]
