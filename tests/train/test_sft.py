"""Issue 23: chat fine-tuning (``prodip sft``): chat tokens appended to an older tokenizer with mean-initialised
rows, the assistant-only loss and its guard (planted faults caught before step 1), packing isolation, the
readers, checkpoints/resume and the held-out assistant-token loss before and after."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from prodip.base.chat import CHAT_TEMPLATE, CHAT_TOKENS, render
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.specials import read_specials
from prodip.cli import main as prodip_main
from prodip.tokenizer.bpe import load_tokenizer
from prodip.train import chat
from prodip.train import checkpoint as ck
from prodip.train.guards import GuardError
from prodip.train.loss import linear_cross_entropy
from prodip.train.model import LlamaForCausalLM
from prodip.train.sft import SFTConfig, extend_vocabulary, run_sft
from prodip.train.trainer import TrainConfig, train
from tests.fixtures import tiny_config

WORDS = {
    "bn": ["আমার", "সোনার", "বাংলা", "আমি", "তোমায়", "ভালোবাসি", "আকাশ", "বাতাস"],
    "en": ["quick", "brown", "fox", "jumps", "over", "lazy", "dog", "time"],
}


def _conversations(lang: str, n: int, seed: int) -> list[dict]:
    """Echo conversations: the reply repeats the user's words (learnable by a tiny model in a few steps)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS[lang], size=3))
        messages = [{"role": "user", "content": f"say {words}"}, {"role": "assistant", "content": words}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "Repeat."})
        if i % 4 == 0:  # multi-turn
            messages += [{"role": "user", "content": "again"}, {"role": "assistant", "content": words}]
        out.append({"messages": messages})
    return out


@pytest.fixture(scope="module")
def chat_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    files = {}
    for k, lang in enumerate(("bn", "en")):
        path = root / f"{lang}.jsonl"
        path.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in _conversations(lang, 60, k)))
        files[lang] = path
    (root / "sources.toml").write_text(  # the records the licence gate asks for (the test's own text)
        '[[source]]\nname = "chat-bn"\nfiles = ["bn.jsonl"]\nlanguage = "bn"\nlicense = "CC0-1.0"\n\n'
        '[[source]]\nname = "chat-en"\nfiles = ["en.jsonl"]\nlanguage = "en"\nlicense = "CC0-1.0"\n'
    )
    return files


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_tokenizer_dir, tiny_shards_dir):
    """A pretrained tiny checkpoint whose tokenizer predates the chat markers."""
    out = tmp_path_factory.mktemp("base") / "run"
    cfg = TrainConfig(
        shards_dir=str(tiny_shards_dir), tokenizer_dir=str(tiny_tokenizer_dir), out_dir=str(out), steps=2,
        batch_size=2, seq_len=32, warmup_steps=0, device="cpu", progress=False, guards=False,
    )  # fmt: skip
    return train(cfg, tiny_config(max_position_embeddings=128))


def _sft_cfg(base, chat_files, out, **kw) -> SFTConfig:
    values = dict(
        inputs={lang: [str(p)] for lang, p in chat_files.items()},
        init_from=str(base),
        out_dir=str(out),
        val_fraction=0.2,
        steps=12,
        batch_size=4,
        seq_len=64,
        lr=3e-3,
        min_lr=3e-4,
        warmup_steps=2,
        device="cpu",
        progress=False,
    )
    values.update(kw)
    return SFTConfig(**values)


def test_sft_appends_chat_tokens_trains_on_replies_and_reports_before_after(tmp_path, base_run, chat_files):
    base_model, base_cfg, _ = ck.load_model(base_run)
    old = load_tokenizer(ck.resolve_checkpoint(base_run) / "tokenizer")
    assert all(old.token_to_id(t) is None for t in CHAT_TOKENS)
    out = tmp_path / "sft"
    result = run_sft(_sft_cfg(base_run, chat_files, out))
    model, cfg, info = ck.load_model(out)
    # the markers appended after the old vocabulary, rows added; the chat tokenizer in every checkpoint
    v = old.get_vocab_size()
    tok = load_tokenizer(info["tokenizer_dir"])
    assert [tok.token_to_id(t) for t in CHAT_TOKENS] == [v, v + 1] and cfg.vocab_size == v + 2
    config = json.loads((info["tokenizer_dir"] / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE and config["additional_special_tokens"] == list(CHAT_TOKENS)
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == (
        info["tokenizer_dir"] / "tokenizer.json"
    ).read_bytes()
    assert info["step"] == 12 and result["step"] == 12
    # held-out assistant-token loss before/after per language, and the curves as in pretraining
    ev = json.loads((out / "sft_eval.json").read_text())
    for lang in ("bn", "en"):
        before, after = ev["before"][lang], ev["after"][lang]
        assert before["assistant_tokens"] == after["assistant_tokens"] > 0 and before["conversations"] >= 3
        assert after["nll_nats_per_token"] < before["nll_nats_per_token"] - 0.5, ev
        assert after["bits_per_char"] == pytest.approx(
            after["nll_nats_per_token"] * after["assistant_tokens"] / math.log(2) / after["assistant_chars"]
        )
    assert ev["model_sha256"] == info["model_sha256"]
    card = json.loads((ck.resolve_checkpoint(out) / "trainer_state.json").read_text())["data_card"]
    assert [(s["name"], s["stage"], s["license"]) for s in card["sources"]] == [
        ("chat-bn", "sft", "CC0-1.0"),
        ("chat-en", "sft", "CC0-1.0"),
    ]  # the base's shards have no records: no pretraining sources
    assert card["init_from"]["kind"] == "prodip"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 13)) and (out / "loss.png").stat().st_size > 1000
    # the base model's own rows were the start: unchanged shape, the rest of the network fine-tuned from them
    assert cfg.hidden_size == base_cfg.hidden_size and cfg.num_hidden_layers == base_cfg.num_hidden_layers


def test_extend_vocabulary_mean_rows_untied_and_tied():
    from prodip.train.init import InitWeights

    for tie in (False, True):
        config = tiny_config(vocab_size=10, tie_word_embeddings=tie)
        model = LlamaForCausalLM(config)
        tensors = {k: v.clone() for k, v in model.state_dict().items()}
        if tie:
            tensors.pop("lm_head.weight")
        w = InitWeights(config, tensors, "test", "prodip")
        extend_vocabulary(w, 12, [10, 11], 10)
        assert w.config.vocab_size == 12
        keys = ["model.embed_tokens.weight"] + ([] if tie else ["lm_head.weight"])
        for key in keys:
            grown = w.tensors[key]
            assert grown.shape == (12, config.hidden_size)
            torch.testing.assert_close(grown[:10], model.state_dict()[key])
            torch.testing.assert_close(grown[10], model.state_dict()[key].mean(0))
            torch.testing.assert_close(grown[11], grown[10])
        assert tie == ("lm_head.weight" not in w.tensors)


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        (
            lambda offsets, spans: np.ones(len(offsets), dtype=bool),
            r"not the assistant's: .*system tokens.*user tokens",
        ),
        (lambda offsets, spans: np.zeros(len(offsets), dtype=bool), "masks every token"),
    ],
    ids=["trains-on-user-and-system", "masks-everything"],
)
def test_planted_mask_faults_are_caught_before_step_one(tmp_path, base_run, chat_files, monkeypatch, fault, named):
    monkeypatch.setattr(chat, "assistant_mask", fault)
    out = tmp_path / "sft"
    with pytest.raises(GuardError, match=named):
        run_sft(_sft_cfg(base_run, chat_files, out, steps=2))
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def test_mask_covers_replies_and_their_end_of_turn_only(tiny_tokenizer_dir, tmp_path):
    from prodip.tokenizer.bpe import add_chat_tokens

    add_chat_tokens(tiny_tokenizer_dir, tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "আমার সোনার বাংলা"},
        {"role": "assistant", "content": "The quick fox."},
        {"role": "user", "content": "again, in Bangla"},
        {"role": "assistant", "content": "ভালোবাসি"},
    ]
    ex = chat.encode_conversation(tok, messages)
    assert ex.ids.tolist() == tok.encode(render(messages, add_generation_prompt=False), add_special_tokens=False).ids
    trained = tok.decode(ex.ids[ex.trained].tolist(), skip_special_tokens=False)
    assert trained == "The quick fox.<|im_end|>ভালোবাসি<|im_end|>"
    assert ex.assistant_chars == len("The quick fox.") + len("ভালোবাসি")
    im = dict(im_start=tok.token_to_id("<|im_start|>"), im_end=tok.token_to_id("<|im_end|>"))
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    assert chat.check_loss_mask([ex], **im, decode=decode)["trained"] == int(ex.trained.sum())
    # the guard reads the roles from the ids, so a mask shifted by one token (onto a role header) is refused
    shifted = dataclasses.replace(ex, trained=np.roll(ex.trained, 1))
    with pytest.raises(GuardError, match="not the assistant's"):
        chat.check_loss_mask([shifted], **im, decode=decode)


def test_packing_isolation_logits_equal_alone(tiny_tokenizer_dir, tmp_path):
    from prodip.tokenizer.bpe import add_chat_tokens

    add_chat_tokens(tiny_tokenizer_dir, tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    a, b = (
        chat.encode_conversation(tok, c["messages"])
        for c in (_conversations("bn", 1, 0)[0], _conversations("en", 2, 1)[1])
    )
    T = 256
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(vocab_size=tok.get_vocab_size(), max_position_embeddings=256)).eval()
    packed = chat.to_batch(chat.pack_rows([a, b], T, 0))
    alone = chat.to_batch(chat.pack_rows([b], T, 0))
    assert packed[0].shape == (1, T) and int(packed[3].max()) == 1  # both in one row
    na, nb = len(a.ids) - 1, len(b.ids) - 1
    with torch.no_grad():
        lp = model(packed[0], position_ids=packed[2], document_ids=packed[3])
        la = model(alone[0], position_ids=alone[2], document_ids=alone[3])
        torch.testing.assert_close(lp[0, na : na + nb], la[0, :nb], atol=1e-5, rtol=1e-5)
        # the test can fail: plain causal attention over the packed row lets b see a
        leaky = model(packed[0], position_ids=packed[2])
        assert (leaky[0, na : na + nb] - la[0, :nb]).abs().max() > 1e-3
    # the targets are the next tokens where trained, -100 elsewhere (padding included)
    y = packed[1][0]
    assert torch.equal(y[:na][torch.from_numpy(a.trained[1:])], torch.from_numpy(a.ids[1:][a.trained[1:]]))
    assert (y[na + nb :] == -100).all() and (packed[2][0, na : na + 3] == torch.arange(3)).all()


def test_loss_ignores_minus_100_like_cross_entropy():
    torch.manual_seed(0)
    h = torch.randn(2, 8, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    t = torch.randint(0, 50, (2, 8))
    t[0, :5] = -100
    t[1, 7] = -100
    ours = linear_cross_entropy(h, w, t, chunk_tokens=3)
    ours.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad, w.grad = None, None
    ref = F.cross_entropy((h @ w.t()).flatten(0, 1), t.flatten(), ignore_index=-100)
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(gh, h.grad)
    torch.testing.assert_close(gw, w.grad)


def test_parquet_csv_and_datasets_inputs_read_like_jsonl(tmp_path, chat_files):
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    records = [json.loads(line) for line in chat_files["en"].read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "c.parquet")
    pa_csv.write_csv(pa.table({"messages": [json.dumps(r["messages"]) for r in records]}), str(tmp_path / "c.csv"))
    want = chat.read_conversations({"en": [str(chat_files["en"])]})["en"]
    for name in ("c.parquet", "c.csv"):
        got = chat.read_conversations({"en": [str(tmp_path / name)]})["en"]
        assert [m for _, m in got] == [m for _, m in want], name
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "ds"))
    got = chat.read_conversations({"en": [str(tmp_path / "ds")]})["en"]
    assert [m for _, m in got] == [m for _, m in want]


def test_bad_conversations_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    for line, match in (
        ('{"messages": [{"role": "user", "content": "hi"}]}', "bad.jsonl:1: no assistant message"),
        ('{"messages": [{"role": "tool", "content": "x"}]}', r"bad.jsonl:1: messages\[0\].role: 'tool'"),
        ('{"messages": [{"role": "user", "content": [{"type": "text"}]}]}', r"messages\[0\].content must be a string"),
        ('{"text": "hello"}', "bad.jsonl:1: expected an object with a field 'messages'"),
        (
            '{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "a"}]}',
            r"bad.jsonl:1: messages\[0\].content holds a lone surrogate \(U\+D800\) at character 0",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "\\udfff b"}]}',
            r"bad.jsonl:1: messages\[1\].content holds a lone surrogate \(U\+DFFF\)",
        ),
        *[
            (
                json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": r}]}),
                r"bad.jsonl:1: messages\[1\].content: an empty \(or whitespace-only\) assistant reply",
            )
            for r in ("", "  \n\t", "\u3000")
        ],
    ):
        bad.write_text(line + "\n")
        with pytest.raises(ValueError, match=match):
            chat.read_conversations({"en": [str(bad)]})


@pytest.mark.parametrize("gz", [False, True], ids=["jsonl", "jsonl.gz"])
def test_invalid_utf8_is_refused_naming_file_and_line_and_no_missing_option(tmp_path, gz):
    import gzip

    good = b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n'
    data = good + b"\n" + good.replace(b'"q"', b'"caf\xe9"') + good
    bad = tmp_path / ("bad.jsonl.gz" if gz else "bad.jsonl")
    bad.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(ValueError) as err:
        chat.read_conversations({"en": [str(bad)]})
    assert str(err.value).startswith(f"{bad}:3: invalid UTF-8 (byte offset {len(good) + 1 + 46} of the file)")
    assert "--errors" not in str(err.value)
    # a stray byte on a line no record is read from is refused too, naming its line
    data = good + b" \xff \n" + good
    bad.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(ValueError, match=f"^{re.escape(str(bad))}:2: invalid UTF-8"):
        chat.read_conversations({"en": [str(bad)]})


def test_special_token_text_in_any_content_is_refused_like_serve(tiny_tokenizer_dir, tmp_path):
    """Every special token's text of the chat tokenizer, in a system, user or assistant content: refused with
    its record named (the one rule of ``prodip.base.chat.special_token_in``, which serve applies to requests)."""
    from prodip.base.chat import special_token_in, special_token_texts
    from prodip.tokenizer.bpe import add_chat_tokens

    add_chat_tokens(tiny_tokenizer_dir, tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    specials = special_token_texts(tok)
    assert set(specials) >= {"<|pad|>", "<|bos|>", "<|eos|>", *CHAT_TOKENS}
    for text in specials:
        for k, role in enumerate(("system", "user", "assistant")):
            messages = [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "how do documents end?"},
                {"role": "assistant", "content": "like this."},
            ]
            messages[k] = {"role": role, "content": f"with {text} like this"}
            assert special_token_in(messages[k]["content"], specials) == text
            with pytest.raises(ValueError, match=rf"^data.jsonl:7: messages\[{k}\].content holds '{re.escape(text)}'"):
                chat.encode_conversation(tok, messages, "data.jsonl:7")
    # the same text without its markers is plain text, trained as such
    ok = [{"role": "user", "content": "what ends a document?"}, {"role": "assistant", "content": "the eos token"}]
    assert int(chat.encode_conversation(tok, ok, "x").trained.sum()) > 0


def test_resume_matches_an_uninterrupted_run_and_cli(tmp_path, base_run, chat_files):
    full = tmp_path / "full"
    run_sft(_sft_cfg(base_run, chat_files, full, steps=4, checkpoint_every_steps=2))
    part = tmp_path / "part"
    argv = ["sft", "--init-from", str(base_run), "--out-dir", str(part), "--steps", "4", "--batch-size", "4"]
    argv += ["--inputs", ",".join(f"{lang}={p}" for lang, p in chat_files.items()), "--val-fraction", "0.2"]
    argv += ["--seq-len", "64", "--lr", "3e-3", "--min-lr", "3e-4", "--warmup-steps", "2", "--device", "cpu"]
    argv += ["--progress", "false", "--checkpoint-every-steps", "2"]
    assert prodip_main([*argv, "--max-steps-this-run", "2"]) == 0
    assert prodip_main([*argv, "--resume"]) == 0
    a, _, ia = ck.load_model(full)
    b, _, ib = ck.load_model(part)
    assert ia["step"] == ib["step"] == 4
    for (name, pa_), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa_, pb, atol=0, rtol=0, msg=name)


def test_init_from_hf_llama_folder_with_a_chat_tokenizer(tmp_path, chat_files):
    """An HF Llama folder whose tokenizer already reserves the markers: no rows added, tokenizer bytes kept."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HF

    from prodip.tokenizer.bpe import train_tokenizer_from_texts

    texts = {lang: [" ".join(ws) * 20] for lang, ws in WORDS.items()}
    hf_dir = train_tokenizer_from_texts(texts, 300, tmp_path / "hf")
    tok = load_tokenizer(hf_dir)
    assert tok.token_to_id("<|im_start|>") == 3
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
    )  # fmt: skip
    HF(cfg).save_pretrained(hf_dir, safe_serialization=True)
    out = tmp_path / "sft"
    run_sft(_sft_cfg(hf_dir, chat_files, out, steps=1, guards=True))
    _, mcfg, info = ck.load_model(out)
    assert mcfg.vocab_size == tok.get_vocab_size() and mcfg.tie_word_embeddings
    assert (info["tokenizer_dir"] / "tokenizer.json").read_bytes() == (hf_dir / "tokenizer.json").read_bytes()


def test_replies_cut_away_by_seq_len_are_skipped_and_counted(tmp_path, base_run, chat_files, caplog):
    long_one = {
        "messages": [
            {"role": "system", "content": "context " * 300},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "the answer"},
        ]
    }
    path = tmp_path / "en.jsonl"
    path.write_text(chat_files["en"].read_text() + json.dumps(long_one) + "\n")
    (tmp_path / "sources.toml").write_text(
        '[[source]]\nname = "chat-en"\nfiles = ["en.jsonl"]\nlanguage = "en"\nlicense = "CC0-1.0"\n'
    )
    cfg = _sft_cfg(base_run, {"en": path}, tmp_path / "sft", steps=1, val_fraction=0.0, guards=False)
    with caplog.at_level("WARNING", logger="prodip.sft"):
        run_sft(cfg)
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped ")]
    assert warned == [
        "skipped 1 conversations whose every reply lies beyond seq_len + 1 = 65 tokens (nothing of them would be "
        f"trained; first {path}:61); raise --seq-len to keep them"
    ]
    assert json.loads((tmp_path / "sft" / "sft_eval.json").read_text())["train_conversations"] == 60


def test_accumulation_guard_runs_on_sft_batches(tmp_path, base_run, chat_files, caplog, monkeypatch):
    """With --grad-accum-steps 2 the trainer checks, before step 1 and on the packed chat rows, that the
    accumulated gradient is the one-batch gradient; a step weighing micro-batches equally is refused."""
    from prodip.train import trainer
    from prodip.train.loop import batch_loss

    with caplog.at_level("INFO", logger="prodip.train"):
        run_sft(_sft_cfg(base_run, chat_files, tmp_path / "ok", steps=1, grad_accum_steps=2, guards=True))
    assert any(r.getMessage().startswith("accumulation guard: 2 accumulated") for r in caplog.records)

    def micro_weighted(m, _opt, micro, **_kw):  # the fault: each micro-batch's mean divided by N
        micro = list(micro)
        for mb in micro:
            (batch_loss(m, mb) / len(micro)).backward()

    monkeypatch.setattr(trainer, "train_step", micro_weighted)
    out = tmp_path / "bad"
    with pytest.raises(GuardError, match="gradient accumulation: accumulated gradients differ"):
        run_sft(_sft_cfg(base_run, chat_files, out, steps=1, grad_accum_steps=4, batch_size=1, guards=True))
    assert not (out / "checkpoints").exists()


def _signal_after(run_dir, steps: int, sig: int) -> threading.Thread:
    """Send ``sig`` to this process once ``run_dir/metrics.jsonl`` holds ``steps`` lines."""

    def watch():
        path, deadline = run_dir / "metrics.jsonl", time.monotonic() + 300
        while time.monotonic() < deadline:
            if path.exists() and len(path.read_text().splitlines()) >= steps:
                os.kill(os.getpid(), sig)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_sigterm_saves_the_current_step_and_the_run_resumes_from_it(tmp_path, base_run, chat_files):
    """No checkpoint is due (end only, none by time): SIGTERM after step 2 saves the step the run stopped
    at, and --resume continues from it."""
    out = tmp_path / "sft"
    cfg = _sft_cfg(base_run, chat_files, out, steps=400, checkpoint_every_steps=0, guards=False)
    assert cfg.train_config().checkpoint_every_s == 0.0
    assert _sft_cfg(base_run, chat_files, out, checkpoint_every_s=30.0).train_config().checkpoint_every_s == 30.0
    before = signal.getsignal(signal.SIGTERM)
    watcher = _signal_after(out, 2, signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        run_sft(cfg)
    watcher.join()
    assert signal.getsignal(signal.SIGTERM) is before  # the run's handler is gone with it
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    kept = ck.resolve_checkpoint(out)
    state = json.loads((kept / "trainer_state.json").read_text())
    assert 2 <= state["step"] == steps[-1] < 400 and len(list((out / "checkpoints").glob("step_*"))) == 1
    resumed = run_sft(dataclasses.replace(cfg, resume=True, max_steps_this_run=1))
    assert resumed["step"] == state["step"] + 1
    assert ck.load_model(out)[2]["step"] == state["step"] + 1


def test_a_run_made_before_sft_had_checkpoint_every_s_is_the_same_run():
    """A pipeline folder whose saved [sft] table predates the key (or sets another value) is not refused
    as "a different config": the key says when saves happen, not what is trained."""
    from prodip.pipeline import _changed_keys, _identity

    saved = {"sft": {"steps": 100, "lr": 1e-4}, "train": {"steps": 5, "checkpoint_every_s": 0.0}}
    now = {
        "sft": {"steps": 100, "lr": 1e-4, "checkpoint_every_s": 0.0},
        "train": {"steps": 5, "checkpoint_every_s": 60.0},
    }
    assert _changed_keys(_identity(saved), _identity(now)) == []
    assert _changed_keys(_identity(saved), _identity({**now, "sft": {**now["sft"], "lr": 2e-4}})) == ["[sft] lr"]


@pytest.fixture(scope="module")
def standin_dirs(tmp_path_factory):
    from tests.standins import build_standin

    root = tmp_path_factory.mktemp("sft_standins")
    return {k: build_standin(k, root / k) for k in ("smollm2", "llama32", "tinyllama")}


@pytest.mark.parametrize("kind, end", [("smollm2", "<|im_end|>"), ("llama32", "<|eot_id|>")])
def test_mask_of_a_base_models_own_template(standin_dirs, kind, end):
    """An imported instruct model's template: the ids are what transformers' apply_chat_template gives, the
    mask trains the replies and their end of turn only, and the guard reads the roles from its markers."""
    from transformers import AutoTokenizer

    from prodip.tokenizer.bpe import load_with_specials

    folder = standin_dirs[kind]
    tok, fmt = load_with_specials(folder)[0], chat.chat_format(folder)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "আমার সোনার বাংলা"},
        {"role": "assistant", "content": "The quick fox."},
        {"role": "user", "content": "again, in Bangla"},
        {"role": "assistant", "content": "ভালোবাসি"},
    ]
    ex = chat.encode_conversation(tok, messages, "t", fmt)
    hf = AutoTokenizer.from_pretrained(str(folder))
    want = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert ex.ids.tolist() == list(want)
    assert tok.decode(ex.ids[ex.trained].tolist(), skip_special_tokens=False) == f"The quick fox.{end}ভালোবাসি{end}"
    ids = dict(im_start=tok.token_to_id(fmt.turn_start), im_end=tok.token_to_id(fmt.end_of_turn))
    decode = lambda i: tok.decode(i, skip_special_tokens=False)  # noqa: E731
    assert chat.check_loss_mask([ex], **ids, decode=decode, header_end=fmt.header_end)["trained"] == ex.trained.sum()
    shifted = dataclasses.replace(ex, trained=np.roll(ex.trained, 1))
    with pytest.raises(GuardError, match="not the assistant's"):
        chat.check_loss_mask([shifted], **ids, decode=decode, header_end=fmt.header_end)


def test_a_template_without_known_turn_markers_is_refused(standin_dirs):
    from prodip.base.errors import InvalidInput

    with pytest.raises(InvalidInput, match=r"tinyllama/tokenizer_config.json: .*neither <\|im_start\|>"):
        chat.chat_format(standin_dirs["tinyllama"])


def test_sft_from_a_base_models_folder_keeps_its_tokenizer_and_template(tmp_path, standin_dirs, chat_files):
    """prodip sft from SmolLM2's folder: its tokenizer copied as is (no markers appended), its template's
    replies trained (the held-out assistant loss falls), the checkpoint a chat model with that template."""
    from prodip.base.chat import chat_contract

    folder = standin_dirs["smollm2"]
    out = tmp_path / "sft"
    run_sft(_sft_cfg(folder, chat_files, out, steps=8, guards=True, seq_len=128))
    _, mcfg, info = ck.load_model(out)
    assert mcfg.vocab_size == 1024
    assert (info["tokenizer_dir"] / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert chat_contract(info["tokenizer_dir"])["chat_template"] == chat_contract(folder)["chat_template"]
    report = json.loads((out / "sft_eval.json").read_text())
    for lang in ("bn", "en"):
        assert report["after"][lang]["nll_nats_per_token"] < report["before"][lang]["nll_nats_per_token"]
    # the run's tokenizer (and each checkpoint's copy) holds the folder's tokenizer files, not its weights
    assert (folder / "model.safetensors").is_file()
    kept = sorted(p.name for p in folder.iterdir() if p.name != "model.safetensors")
    assert sorted(p.name for p in (out / "tokenizer").iterdir()) == kept
    assert sorted(p.name for p in info["tokenizer_dir"].iterdir()) == kept
    assert dataclasses.replace(read_specials(info["tokenizer_dir"]), source="") == dataclasses.replace(
        read_specials(folder), source=""
    )  # stop ids from generation_config.json, as from the folder
    # it exports as a chat model with the folder's tokenizer, template and stop ids
    export = tmp_path / "export"
    assert prodip_main(["export", "--checkpoint", str(out), "--out", str(export), "--variants", "safetensors"]) == 0
    assert (export / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert chat_contract(export)["chat_template"] == chat_contract(folder)["chat_template"]
    gen = json.loads((export / "generation_config.json").read_text())
    assert gen["eos_token_id"] == list(read_specials(folder).stop_ids) == [2, 0]  # <|im_end|>, <|endoftext|>


def _examples(n: int, seed: int) -> list[chat.Example]:
    """Conversations of random ids whose second half is trained (enough for the packing stream)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        L = int(rng.integers(4, 12))  # < seq_len: no chat row looks like a replay window
        trained = np.zeros(L, dtype=bool)
        trained[L // 2 :] = True
        out.append(chat.Example(rng.integers(5, 50, size=L), trained, L, f"c{i}"))
    return out


@pytest.mark.parametrize("share,batch_size,world_size", [(0.25, 4, 1), (0.3, 2, 2)])
def test_replay_rows_come_at_the_share_with_pretraining_targets_and_resume(
    tiny_shards_dir, share, batch_size, world_size
):
    from prodip.train.data import MixtureBatches  # noqa: PLC0415

    T, exs = 16, _examples(40, 0)

    def make(rank: int) -> chat.ReplayBatches:
        cb = chat.ChatBatches(exs, batch_size, T, pad_id=0, seed=3, rank=rank, world_size=world_size, langs=["x"])
        return chat.ReplayBatches(cb, MixtureBatches(tiny_shards_dir, {}, 1, T, seed=3), share)

    ranks = [make(r) for r in range(world_size)]
    windows = MixtureBatches(tiny_shards_dir, {}, 1, T, seed=3)  # the same pretraining stream, drawn alone
    plain = chat.ChatBatches(exs, batch_size, T, pad_id=0, seed=3, world_size=world_size)
    n, steps, replayed = batch_size * world_size, 10, 0
    for _ in range(steps):
        rows = [torch.stack(b.next_batch(), dim=1) for b in ranks]  # per rank (B, 4, T)
        glob = torch.cat(rows)  # the global batch, rank order
        is_replay = glob[:, 3].eq(0).all(dim=1) & glob[:, 2].eq(torch.arange(T)).all(dim=1)
        r = int(is_replay.sum())
        assert is_replay[n - r :].all() and not is_replay[: n - r].any()  # chat rows first, replay last
        for row in glob[n - r :]:
            x, y = windows.next_batch()
            assert torch.equal(row[0], x[0]) and torch.equal(row[1], y[0])  # every token a target
        chat_rows = plain.take_rows(n - r)
        assert all(torch.equal(glob[i], torch.from_numpy(chat_rows[i])) for i in range(n - r))
        replayed += r
    assert replayed == int(share * n * steps)  # the share of rows, exactly over these 10 batches
    assert ranks[0].tokens["replay"] == replayed * T == sum(ranks[0].replay_tokens_by_language.values())
    # resume: a fresh loader given the state continues both streams exactly
    state = json.loads(json.dumps(ranks[0].state_dict()))
    again = make(0)
    again.load_state_dict(state)
    for _ in range(4):
        for a, b in zip(ranks[0].next_batch(), again.next_batch()):
            assert torch.equal(a, b)
    with pytest.raises(InvalidInput, match="replay_share"):
        chat.ReplayBatches(plain, MixtureBatches(tiny_shards_dir, {}, 1, T, seed=3), 0.5).load_state_dict(state)


def test_sft_replay_share_records_replay_and_resumes_exactly(tmp_path, base_run, chat_files, caplog):
    full = tmp_path / "full"
    kw = dict(steps=4, checkpoint_every_steps=2, replay_share=0.25, grad_accum_steps=2)
    with caplog.at_level("INFO", logger="prodip.train"):  # the guards run on the mixed rows
        run_sft(_sft_cfg(base_run, chat_files, full, **kw))
    # token weighting: the accumulated gradient of chat + replay micro-batches is the one-batch gradient
    assert any(r.getMessage().startswith("accumulation guard: 2 accumulated") for r in caplog.records)
    ev = json.loads((full / "sft_eval.json").read_text())
    rep = ev["replay"]  # batch 4 x 0.25 = one replay row of seq_len 64 per micro-batch, 2 per step
    assert rep["share_of_rows"] == 0.25 and rep["trained_tokens"]["replay"] == 4 * 2 * 64
    assert sum(rep["tokens_by_language"].values()) == 4 * 2 * 64 and set(rep["tokens_by_language"]) == {"bn", "en"}
    assert 0.25 < rep["share_of_trained_tokens"] < 1  # a replay row trains all its tokens, a chat row its replies
    state = json.loads((ck.resolve_checkpoint(full) / "trainer_state.json").read_text())
    assert state["data_card"]["replay"] == rep and state["data_state"]["kind"] == "chat+replay"
    part = tmp_path / "part"
    run_sft(_sft_cfg(base_run, chat_files, part, max_steps_this_run=2, guards=False, **kw))
    run_sft(_sft_cfg(base_run, chat_files, part, resume=True, guards=False, **kw))
    a, _, _ = ck.load_model(full)
    b, _, _ = ck.load_model(part)
    for (name, pa_), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa_, pb, atol=0, rtol=0, msg=name)
    assert json.loads((part / "sft_eval.json").read_text())["replay"] == rep
    # the card states it, and the same statement is what conformance reads back from README.md
    from prodip.export.card import build_card, data_statement  # noqa: PLC0415

    text = data_statement(build_card(state["data_card"]))
    assert "25.0% of each step's rows were windows of the pretraining shards" in text
    assert f"bn {rep['tokens_by_language']['bn']:,}" in text
    # share 0 is the chat-only run: no replay state, record or card line
    plain = tmp_path / "plain"
    run_sft(_sft_cfg(base_run, chat_files, plain, steps=2, guards=False))
    state0 = json.loads((ck.resolve_checkpoint(plain) / "trainer_state.json").read_text())
    assert state0["data_state"]["kind"] == "chat" and "replay" not in state0["data_card"]
    assert "replay" not in json.loads((plain / "sft_eval.json").read_text())
    assert "replayed" not in data_statement(build_card(state0["data_card"]))


def test_replay_needs_known_shards(tmp_path, chat_files, base_run):
    with pytest.raises(MissingInput, match="no meta.json"):
        run_sft(_sft_cfg(base_run, chat_files, tmp_path / "o", replay_share=0.2, replay_shards_dir=str(tmp_path)))
    with pytest.raises(InvalidInput, match="replay_share"):
        _sft_cfg(base_run, chat_files, tmp_path / "o", replay_share=1.0)


def test_a_refused_sft_leaves_nothing_and_names_the_base_file(tmp_path, standin_dirs, chat_files, capsys):
    """TinyLlama's template is refused naming the base folder's tokenizer_config.json, not the run's copy,
    and nothing is written: no --out-dir, no staged tokenizer beside it."""
    from prodip.cli import main as prodip_main

    inputs = f"bn={chat_files['bn']}"
    out = tmp_path / "runs" / "sft"
    args = ["sft", "--init-from", str(standin_dirs["tinyllama"]), "--inputs", inputs, "--out-dir", str(out)]
    assert prodip_main([*args, "--steps", "1", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"prodip sft: error: {standin_dirs['tinyllama'] / 'tokenizer_config.json'}: "), err
    assert "neither <|im_start|>" in err
    assert list(tmp_path.rglob("*")) == []


def test_sft_errors_name_the_stage_once(tmp_path, standin_dirs, chat_files, capsys):
    """``prodip sft: error: MESSAGE`` as ``prodip train: error: ...``: the message does not name the stage again."""
    out = tmp_path / "sft"
    args = ["sft", "--init-from", str(standin_dirs["smollm2"]), "--inputs", f"en={chat_files['en']}"]
    args += ["--out-dir", str(out), "--steps", "1", "--seq-len", "8", "--val-fraction", "0", "--device", "cpu"]
    assert prodip_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("prodip sft: error: all 60 conversations are longer than --seq-len 8 tokens "), err
    assert not out.exists()


def test_all_conversations_too_long_is_the_reason_given_and_nothing_is_written(tmp_path, standin_dirs, chat_files):
    """--seq-len below every first reply: the error says so and which --seq-len keeps one (one token less is
    refused, that one trains), and the refused run writes neither tokenizer/ nor sft_eval.json."""
    from prodip.base.errors import InvalidInput

    folder = standin_dirs["smollm2"]
    inputs = {"en": chat_files["en"]}
    out = tmp_path / "sft"
    with pytest.raises(InvalidInput, match=r"first reply starts at token (\d+), so --seq-len \1 keeps") as err:
        run_sft(_sft_cfg(folder, inputs, out, steps=1, seq_len=8, val_fraction=0.0, guards=False))
    assert str(err.value).startswith("all 60 conversations are longer than --seq-len 8 tokens before their")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    first = int(re.search(r"starts at token (\d+)", str(err.value)).group(1))
    assert 8 < first < 64
    with pytest.raises(InvalidInput, match=f"all 60 conversations are longer than --seq-len {first - 1} "):
        run_sft(_sft_cfg(folder, inputs, out, steps=1, seq_len=first - 1, val_fraction=0.0, guards=False))
    assert not out.exists()
    run_sft(_sft_cfg(folder, inputs, out, steps=1, seq_len=first, val_fraction=0.0, guards=False))
    assert json.loads((out / "sft_eval.json").read_text())["train_conversations"] >= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft"]  # the staged tokenizer moved in
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    # conversations the hash holds out at val_fraction 0.5 only: the other reason, with its figures
    lines = chat_files["en"].read_text().splitlines()
    held = [line for line in lines if chat.is_heldout(json.loads(line)["messages"], 0.5)][:3]
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "en.jsonl").write_text("\n".join(held) + "\n")
    (tmp_path / "held" / "sources.toml").write_text((chat_files["en"].parent / "sources.toml").read_text())
    with pytest.raises(InvalidInput, match=r"no training conversations: of 3, 3 held out \(val_fraction 0.5\)"):
        run_sft(_sft_cfg(folder, {"en": tmp_path / "held" / "en.jsonl"}, tmp_path / "h", steps=1, val_fraction=0.5))
    assert not (tmp_path / "h").exists()
