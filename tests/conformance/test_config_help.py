"""``[conformance] runtimes``' help is written from the runtime table, not by hand."""

import dataclasses

from prodip.base import runtimes
from prodip.conformance import config


def test_runtimes_help_names_every_on_device_row_and_the_default():
    field = next(f for f in dataclasses.fields(config.ConformanceConfig) if f.name == "runtimes")
    text = field.metadata["help"]
    assert text == config._runtimes_help()
    for name in runtimes.on_device():
        assert f"{name} (" in text
    assert f"Default: {', '.join(runtimes.default_on_device())};" in text
    # the Node rows carry npm's install command, the Python one pip's; only onnxruntime-web gates logits too
    assert "onnxruntime-genai (pip install 'prodip[runtimes]')" in text
    assert f"transformers.js (Node; `{runtimes.NPM_HINT}` in the prodip repository)" in text
    assert text.count("also gates its logits") == sum(
        1 for n in runtimes.on_device() if runtimes.by_name(n).logits_metric
    )


def test_runtimes_help_follows_a_new_row(monkeypatch):
    row = runtimes.Runtime("fake-rt", "npm:fake-rt", ("onnx",), npm=("fake-rt",), greedy_metric="fake_greedy")
    monkeypatch.setattr(runtimes, "RUNTIMES", (*runtimes.RUNTIMES, row))
    text = config._runtimes_help()
    assert f"fake-rt (Node; `{runtimes.NPM_HINT}` in the prodip repository)" in text
    assert "fake-rt;" in text  # default: a row with a greedy metric runs unless it says otherwise
