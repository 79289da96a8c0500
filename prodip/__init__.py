"""prodip: train a small Llama-style LM in PyTorch, export it, prove the export conforms, serve it.

The stages live in the top-level packages ``tokenizer``, ``train``, ``export``, ``conformance``
and ``serve``; this package holds only what spans them: the ``prodip`` command line
(:mod:`prodip.cli`), the config loader (:mod:`prodip.base.config`) and the whole-pipeline driver
(:mod:`prodip.pipeline`).

    prodip --help
"""

__version__ = "0.1.0"
