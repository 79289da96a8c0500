"""[train] compile_scope / compile_mode: what gets compiled, and that checkpoints keep the HF keys."""

from __future__ import annotations

import pytest

from prodip.base.config import from_dict
from prodip.train.model import LlamaForCausalLM
from prodip.train.trainer import TrainConfig, compile_model
from tests.fixtures import tiny_config


def test_layers_scope_compiles_each_decoder_layer_in_place():
    model = LlamaForCausalLM(tiny_config())
    keys = list(model.state_dict())
    out = compile_model(model, mode="default", scope="layers")
    assert out is model and list(model.state_dict()) == keys  # no _orig_mod. prefix anywhere
    assert all(layer._compiled_call_impl is not None for layer in model.model.layers)
    assert model._compiled_call_impl is None and model.lm_head._compiled_call_impl is None


def test_model_scope_wraps_the_model():
    model = LlamaForCausalLM(tiny_config())
    wrapped = compile_model(model, mode="reduce-overhead", scope="model")
    assert wrapped is not model and wrapped._orig_mod is model
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)


def test_unknown_values_are_refused():
    for field, bad in (("compile_scope", "blocks"), ("compile_mode", "fast"), ("attention_backend", "xformers")):
        with pytest.raises(ValueError, match=field):
            from_dict(TrainConfig, {field: bad}, source="x.toml")
