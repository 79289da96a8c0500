"""Chat (generation) tasks through the chat template (``prodip.train.lmeval``, ``prodip.conformance.tasks``).

Known answers: a fake decoder whose greedy reply is the user's message copied token by token, then the
end-of-turn token, then the message again (a reply that would go on): the harness's scores of a task written
here as lm-eval YAML are exact match 1 where the reference is the message and sacrebleu's sentence chrF where
it is not, the ``until`` string cuts a reply, and the prompt the decoder saw is the chat template's rendering.
On a real tiny chat model (its greedy reply planted to end with ``<|im_end|>``, the model would continue after
it) the checkpoint in PyTorch and its fp32 ONNX export give the same replies and the same task figures; a base
model leaves the chat tasks out.

    python -m pytest tests/train/test_lmeval_chat.py -q
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("lm_eval")

#: (message, reference): the fake copies the message, so exact match is 1 where they are equal
ITEMS = [
    {"q": "hello world", "a": "hello world"},
    {"q": "good morning", "a": "good evening"},
    {"q": "one two. three four", "a": "one two"},  # the task's until "." cuts the reply before it
    {"q": "আমি বাড়ি যাচ্ছি", "a": "আমি বাড়ি যাচ্ছি"},
]


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory) -> Path:
    """The tiny test tokenizer (byte-level BPE) with the chat markers and prodip's template."""
    from prodip.tokenizer.bpe import train_tokenizer_from_texts
    from tests.fixtures import TINY_TEXTS, add_chat_tokens

    tok_dir = train_tokenizer_from_texts(TINY_TEXTS, 300, tmp_path_factory.mktemp("chat_tok") / "tokenizer")
    add_chat_tokens(tok_dir)
    return tok_dir


class CopyDecoder:
    """A :data:`prodip.train.lmeval.StepFn` whose argmax reply to a chat prompt is the first user message's tokens,
    then ``<|im_end|>``, then the message's tokens again (what a reply that does not stop would hold). It keeps
    each row's tokens as its "cache" and records the prompts it was given."""

    def __init__(self, tokenizer: Any, im_start: int, im_end: int) -> None:
        self.tok, self.im_start, self.im_end = tokenizer, im_start, im_end
        self.vocab = tokenizer.get_vocab_size()
        self.prompts: list[list[int]] = []

    def _next(self, seq: list[int], prompt_len: int) -> int:
        start = seq.index(self.im_start)
        header_and_message = self.tok.decode(seq[start + 1 : seq.index(self.im_end)], skip_special_tokens=False)
        message = self.tok.encode(header_and_message.split("\n", 1)[1], add_special_tokens=False).ids
        k = len(seq) - prompt_len  # tokens replied so far
        planned = [*message, self.im_end, *message]
        return planned[k % len(planned)]

    def __call__(self, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        if state is None:  # the prompts, left-padded
            rows = [[int(t) for t, m in zip(ids[r], mask[r]) if m] for r in range(ids.shape[0])]
            self.prompts += [list(r) for r in rows]
            state = [(r, len(r)) for r in rows]
        else:
            state = [(seq + [int(ids[r, 0])], n) for r, (seq, n) in enumerate(state)]
        logits = np.zeros((ids.shape[0], ids.shape[1], self.vocab), dtype=np.float32)
        for r, (seq, n) in enumerate(state):
            logits[r, -1, self._next(seq, n)] = 1.0
        return logits, state


@pytest.fixture(scope="module")
def copy_task(tmp_path_factory) -> Path:
    """A generation task folder: ``copy_chat.yaml`` over ``copy_chat.jsonl``."""
    folder = tmp_path_factory.mktemp("chat_tasks")
    data = folder / "copy_chat.jsonl"
    data.write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in ITEMS), encoding="utf-8")
    utils = Path(__file__).resolve().parents[2] / "train" / "tasks" / "utils.py"
    (folder / "utils.py").write_text(utils.read_text(encoding="utf-8"), encoding="utf-8")  # sentence_chrf
    (folder / "copy_chat.yaml").write_text(
        "task: copy_chat\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "output_type: generate_until\n"
        "test_split: test\n"
        'doc_to_text: "{{q}}"\n'
        'doc_to_target: "{{a}}"\n'
        'generation_kwargs:\n  until: ["."]\n  max_gen_toks: 24\n  do_sample: false\n'
        "metric_list:\n"
        "  - metric: !function utils.sentence_chrf\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n  language: mixed\n",
        encoding="utf-8",
    )
    return folder


def _copy_lm(tok_dir: Path, batch_size: int = 3) -> tuple[Any, CopyDecoder, Any]:
    from prodip.base.chat import IM_END, IM_START
    from prodip.tokenizer.bpe import load_tokenizer
    from prodip.train import lmeval

    tok = load_tokenizer(tok_dir)
    fake = CopyDecoder(tok, tok.token_to_id(IM_START), tok.token_to_id(IM_END))
    chat = lmeval.chat_format(tok_dir)
    assert chat is not None and chat.end_of_turn_id == tok.token_to_id(IM_END)
    lm = lmeval.make_lm(
        tok, lmeval.step_logits(fake), bos_id=1, eos_id=2, max_length=96, batch_size=batch_size, step_fn=fake, chat=chat
    )
    return lm, fake, tok


def test_copy_decoder_known_answers_through_the_harness(chat_tokenizer, copy_task):
    import sacrebleu

    from prodip.base.chat import render
    from prodip.train import lmeval

    lm, fake, tok = _copy_lm(chat_tokenizer)
    (row,) = lmeval.run_tasks(lm, ["copy_chat"], task_paths=[copy_task])
    assert row["output_type"] == "generate_until" and row["items"] == len(ITEMS) and row["chance"] is None
    assert row["metric"] == "sentence_chrf" and row["higher_is_better"] is True
    # replies: the message up to <|im_end|> (not the copy after it), cut before the task's "." where it has one
    replies = [i["q"].split(".")[0] for i in ITEMS]
    hits = [int(r == i["a"]) for r, i in zip(replies, ITEMS)]
    assert hits == [1, 0, 1, 1]
    chrf = [sacrebleu.sentence_chrf(r, [i["a"]]).score for r, i in zip(replies, ITEMS)]
    assert chrf[0] == chrf[2] == chrf[3] == 100.0 and 0 < chrf[1] < 100
    n = len(ITEMS)

    def mean_stderr(xs: list[float]) -> float:
        m = sum(xs) / n
        return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)

    assert row["scores"]["exact_match"]["value"] == pytest.approx(sum(hits) / n)
    assert row["scores"]["exact_match"]["stderr"] == pytest.approx(mean_stderr(hits))
    assert row["scores"]["sentence_chrf"]["value"] == pytest.approx(sum(chrf) / n)
    assert row["scores"]["sentence_chrf"]["stderr"] == pytest.approx(mean_stderr(chrf))
    # each prompt was the chat template's rendering of the message as a user turn (the template writes <|bos|>)
    want = [tok.encode(render([{"role": "user", "content": i["q"]}]), add_special_tokens=False).ids for i in ITEMS]
    assert sorted(fake.prompts) == sorted(want)


def test_greedy_until_stops_at_end_of_turn_and_budget(chat_tokenizer):
    """The reply ends at <|im_end|> though the decoder goes on; without it as a stop, the copy after it runs to the
    token budget; a row's budget is its own."""
    from prodip.base.chat import render
    from prodip.train import lmeval

    _, fake, tok = _copy_lm(chat_tokenizer)
    eot = tok.token_to_id("<|im_end|>")
    messages = ["hello world", "a much longer message than the first one"]
    prompts = [tok.encode(render([{"role": "user", "content": m}]), add_special_tokens=False).ids for m in messages]
    decode = lambda ids: tok.decode(list(ids), skip_special_tokens=True)  # noqa: E731
    kw = dict(until=[[], []], decode=decode, max_length=128, batch_size=2)
    assert lmeval.greedy_until(fake, prompts, max_new=[64, 64], stop_ids={eot}, **kw) == messages
    n0 = len(tok.encode(messages[0], add_special_tokens=False).ids)
    went_on = lmeval.greedy_until(fake, prompts, max_new=[2 * n0 + 1, 3], stop_ids=set(), **kw)
    assert went_on[0] == messages[0] * 2  # message, <|im_end|> (skipped in the text), message again
    assert went_on[1] == decode(tok.encode(messages[1], add_special_tokens=False).ids[:3])
    with pytest.raises(Exception, match="generation request 0: 128 prompt tokens"):
        lmeval.greedy_until(
            fake, [[1] * 128], max_new=[4], stop_ids={eot}, until=[[]], decode=decode, max_length=128, batch_size=1
        )


def test_base_model_leaves_chat_tasks_out(chat_tokenizer, copy_task, caplog):
    from prodip.tokenizer.bpe import load_tokenizer
    from prodip.train import lmeval

    tok = load_tokenizer(chat_tokenizer)
    fake = CopyDecoder(tok, tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>"))
    lm = lmeval.make_lm(tok, lmeval.step_logits(fake), bos_id=1, eos_id=2, max_length=96, step_fn=fake, chat=None)
    with caplog.at_level("INFO", logger="prodip.train.lmeval"):
        assert lmeval.run_tasks(lm, ["copy_chat"], task_paths=[copy_task]) == []
    assert "copy_chat: a generation task runs through a chat template" in caplog.text
    assert fake.prompts == []


# ---- a real tiny chat model: the checkpoint and its fp32 ONNX export -------------------------------------


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory) -> tuple[Path, dict]:
    from tests.fixtures import build_tiny_chat_export

    return build_tiny_chat_export(tmp_path_factory.mktemp("chat_export"), variants=["fp32"])


def test_checkpoint_and_fp32_onnx_reply_alike_and_stop_at_end_of_turn(chat_export):
    from prodip.conformance.runners import OrtRunner
    from prodip.tokenizer.bpe import load_tokenizer
    from prodip.train import lmeval
    from prodip.train.checkpoint import load_model

    export, planted = chat_export
    model, mcfg, info = load_model(export.parent / "run")
    tok = load_tokenizer(export)
    chat = lmeval.chat_format(export)
    assert chat is not None and chat.end_of_turn_id == planted["end_of_turn_id"]
    ort = OrtRunner(
        export / "onnx" / "model.onnx",
        "fp32",
        num_layers=mcfg.num_hidden_layers,
        num_kv_heads=mcfg.num_key_value_heads,
        head_dim=mcfg.head_dim,
        threads=1,
    )
    decode = lambda ids: tok.decode(list(ids), skip_special_tokens=True)  # noqa: E731
    # the planted prompt (its reply ends with <|im_end|>) beside shorter ones: left padding in one batch
    prompts = [planted["prompt_ids"], planted["prompt_ids"][-9:], planted["prompt_ids"][-5:]]
    kw = dict(max_new=[12, 12, 12], stop_ids={chat.end_of_turn_id, 2}, until=[[], [], []], decode=decode)
    ours = lmeval.greedy_until(
        lmeval.torch_step(model, torch.device("cpu")), prompts, max_length=128, batch_size=3, **kw
    )
    onnx = lmeval.greedy_until(ort.forward, prompts, max_length=128, batch_size=3, **kw)
    assert ours == onnx
    assert ours[0] == decode(planted["reply_ids"][:-1])  # stopped at the planted <|im_end|>
    # one prompt at a time (no padding) gives the same replies as the padded batch
    assert [
        lmeval.greedy_until(ort.forward, [p], max_length=128, batch_size=1, **{**kw, "max_new": [12], "until": [[]]})[0]
        for p in prompts
    ] == onnx


def test_conformance_scores_chat_tasks_on_checkpoint_fp32_and_a_twin(chat_export):
    from prodip.conformance import tasks as conf_tasks
    from prodip.tokenizer.bpe import load_tokenizer
    from prodip.train import lmeval
    from prodip.train.checkpoint import load_model

    export, _ = chat_export
    model, mcfg, _ = load_model(export.parent / "run")
    names = ["prodip_tatoeba_chat_en2bn", "prodip_tatoeba_chat_bn2en"]
    settings = lmeval.task_settings(names, num_fewshot=None, limit=6, task_paths=[], seed=0)
    measured = conf_tasks.evaluate_tasks(
        settings, export, {"fp32": "onnx/model.onnx"}, model, mcfg, load_tokenizer(export), threads=1
    )
    rows = measured["rows"]
    assert [(r["task"], r["language"], r["output_type"], r["items"]) for r in rows] == [
        ("prodip_tatoeba_chat_en2bn", "bn", "generate_until", 6),
        ("prodip_tatoeba_chat_bn2en", "en", "generate_until", 6),
    ]
    for r in rows:
        assert list(r["scores"]) == ["random twin", "checkpoint", "fp32"] and r["chance"] is None
        assert r["scores"]["fp32"] == r["scores"]["checkpoint"]  # the same replies, to the last digit
        assert r["metric"] == "sentence_chrf" and 0 <= r["scores"]["checkpoint"]["sentence_chrf"]["value"] <= 100
    (card_row, _) = conf_tasks.card_rows(measured, None, checkpoint_sha256="x")
    assert card_row.output_type == "generate_until" and card_row.flagged == []
    assert list(card_row.scores) == ["random twin", "checkpoint", "fp32"]
