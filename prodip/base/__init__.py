"""The ground floor of prodip: what every stage shares, without torch or onnx.

Everything here is importable by ``prodip serve`` (which must not import torch) and by every
stage; nothing here imports a stage, the pipeline driver or the command line. One module each:

- :mod:`prodip.base.errors`: :class:`~prodip.base.errors.UserError` and its kinds (what a user can fix).
- :mod:`prodip.base.config`: TOML + dataclass config loader, flags generated from fields.
- :mod:`prodip.base.files`: file hashing and atomic writes.
- :mod:`prodip.base.layout`: where each artifact of a ``prodip run`` lives under its ``out_dir``.
- :mod:`prodip.base.variants`: the export variants (names, files, formats, dtypes) and a variant's manifest entry.
- :mod:`prodip.base.onnx_io`: the ONNX decoder's input and output names.
- :mod:`prodip.base.records`: the one pattern of typed artifact records (format_version, one atomic
  writer, one validating reader).
- :mod:`prodip.base.manifest`: the export dir's ``manifest.json``, the one reader and writer of the file.
- :mod:`prodip.base.verdict`: the manifest's conformance verdict.
- :mod:`prodip.base.card`: the manifest's model card facts and quality figures.
- :mod:`prodip.base.stage`: the record each stage gives the pipeline driver.

    python -c "import prodip.base.variants as v; print(v.ONNX_VARIANTS)"
"""
