"""Known-answer tests for train/eval.py (``prodip eval``).

A tiny checkpoint (2 layers, hidden 32) is trained for a few steps on real Bangla/English text
encoded with the conftest's tiny tokenizer, saved with ``prodip.train.checkpoint.save_checkpoint``, and
scored on validation shards written with ``prodip.tokenizer.shards``. Checked: bits/char equals total
NLL / ln 2 / characters of the independently decoded tokens; the batched NLL equals a plain
per-window loop; the random twin (init std 0.002) scores ln V; MC log-likelihoods equal the
closed form of a hand-made uniform model.

    python -m pytest tests/train/test_eval.py -q
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from prodip.train import eval as ev
from prodip.train import mc
from prodip.train.model import LlamaForCausalLM
from tests.fixtures import tiny_config

DOCS = {
    "bn": [
        "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।",
        "চিরদিন তোমার আকাশ, তোমার বাতাস, আমার প্রাণে বাজায় বাঁশি।",
        "ওগো মা, তোমার কোলে জনম আমার, মরণ তোমার বুকে।",
        "রবীন্দ্রনাথ ঠাকুর বাংলা ভাষার কবি।",
    ],
    "en": [
        "The quick brown fox jumps over the lazy dog.",
        "A stitch in time saves nine.",
        "All that glitters is not gold; the early bird catches the worm.",
        "Rome was not built in a day.",
    ],
}
BOS, EOS = 1, 2


def _encode_stream(tok, docs: list[str], repeat: int) -> np.ndarray:
    """Documents as the shards hold them: <|bos|> ids <|eos|>."""
    ids: list[int] = []
    for _ in range(repeat):
        for doc in docs:
            ids += [BOS] + tok.encode(doc, add_special_tokens=False).ids + [EOS]
    return np.asarray(ids, dtype=np.int64)


@pytest.fixture(scope="module")
def eval_env(tmp_path_factory, tiny_tokenizer_dir):
    """(run_dir, shards_dir, tokenizer, vocab_size): a trained tiny checkpoint + real-text shards."""
    from prodip.tokenizer.bpe import load_tokenizer, tokenizer_sha256
    from prodip.tokenizer.shards import write_meta, write_shard
    from prodip.train.checkpoint import save_checkpoint

    tok = load_tokenizer(tiny_tokenizer_dir)
    vocab = tok.get_vocab_size()
    root = tmp_path_factory.mktemp("eval")
    shards = root / "shards"
    langs = {}
    for lang, docs in DOCS.items():
        stream = _encode_stream(tok, docs, repeat=6)
        (shards / lang).mkdir(parents=True)
        write_shard(shards / lang / "val_000000.bin", stream, "uint16")
        write_shard(shards / lang / "train_000000.bin", stream, "uint16")
        langs[lang] = {
            split: [{"file": f"{lang}/{split}_000000.bin", "n_tokens": len(stream)}] for split in ("train", "val")
        }
    write_meta(
        shards,
        {
            "tokenizer_sha256": tokenizer_sha256(tiny_tokenizer_dir),
            "vocab_size": vocab,
            "token_dtype": "uint16",
            "bos_id": 1,
            "eos_id": 2,
            "pad_id": 0,
            "languages": langs,
        },
    )
    cfg = tiny_config(vocab_size=vocab, max_position_embeddings=128, initializer_range=0.002, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    data = torch.from_numpy(np.concatenate([_encode_stream(tok, d, 6) for d in DOCS.values()]))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    for step in range(20):  # a little training: the checkpoint must beat its random twin
        starts = torch.randint(0, len(data) - 33, (8,), generator=torch.Generator().manual_seed(step))
        rows = torch.stack([data[s : s + 33] for s in starts])
        loss = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    run = root / "run"
    save_checkpoint(run / "checkpoints", step=20, model=model, model_config=cfg, tokenizer_dir=tiny_tokenizer_dir)
    return run, shards, tok, vocab


def _cfg(eval_env, **kw) -> ev.EvalConfig:
    run, shards, _, _ = eval_env
    base = dict(checkpoint=str(run), shards_dir=str(shards), eval_tokens=300, seq_len=64, batch_size=3)
    return ev.EvalConfig(**{**base, **kw})


def test_bits_per_char_known_answer(eval_env) -> None:
    run, shards, tok, vocab = eval_env
    from prodip.tokenizer.shards import read_shard

    stream = np.asarray(read_shard(shards / "bn" / "val_000000.bin"), dtype=np.int64)
    # a budget ending exactly after 2 documents (the stream's first <|bos|> is context, not scored)
    two_docs = int(np.flatnonzero(stream == EOS)[1])
    result = ev.evaluate(_cfg(eval_env, eval_tokens=two_docs))
    assert result["languages"]["bn"]["chars"] == len(DOCS["bn"][0]) + len(DOCS["bn"][1])
    result = ev.evaluate(_cfg(eval_env))  # budget 300 tokens: cuts a document (and maybe a letter)
    assert (run / "eval.json").is_file() and not list(run.glob("*.tmp"))
    assert json.loads((run / "eval.json").read_text()) == json.loads(json.dumps(result))
    assert result["format_version"] == 1 and result["checkpoint"]["step"] == 20
    for lang in DOCS:
        row = result["languages"][lang]
        stream = np.asarray(read_shard(shards / lang / "val_000000.bin"), dtype=np.int64)
        assert row["tokens"] == 300 and stream[0] == BOS
        text = tok.decode(stream[1:301].tolist(), skip_special_tokens=True)
        assert text.startswith(DOCS[lang][0])  # a clean start: no cut character in front
        assert row["chars"] == len(text.rstrip("\ufffd")) + ("\ufffd" in text[-1:])
        for name in ("trained", "random_init"):
            m = row[name]
            assert m["bits_per_char"] == pytest.approx(m["nll_nats_total"] / math.log(2) / row["chars"], rel=1e-12)
            assert m["nll_nats_per_token"] == pytest.approx(m["nll_nats_total"] / 300, rel=1e-12)
        # the trained model beats the random twin, whose NLL is ln V for init std 0.002
        assert row["random_init"]["nll_nats_per_token"] == pytest.approx(math.log(vocab), abs=0.01)
        assert row["trained"]["nll_nats_per_token"] < row["random_init"]["nll_nats_per_token"] - 0.5


def test_batched_nll_equals_plain_window_loop(eval_env) -> None:
    run, shards, _, _ = eval_env
    from prodip.train.checkpoint import load_model

    result = ev.evaluate(_cfg(eval_env, out=str(run / "other" / "e.json"), languages=["bn"]))
    assert list(result["languages"]) == ["bn"] and (run / "other" / "e.json").is_file()
    model, _, _ = load_model(run)
    stream = torch.from_numpy(ev.read_val_tokens(shards, "bn", 301))
    assert stream.shape == (301,) and stream[0] == BOS  # <|bos|> + the 300 scored tokens
    total = 0.0
    with torch.no_grad():
        for s in range(0, 300, 64):  # 4 full windows of 64 + a tail of 44, one at a time
            x = stream[s : min(s + 65, 301)]
            total += F.cross_entropy(model(x[None, :-1])[0], x[1:], reduction="sum").item()
    assert result["languages"]["bn"]["trained"]["nll_nats_total"] == pytest.approx(total, rel=1e-5)


def test_random_twin_depends_on_seed_only(eval_env) -> None:
    a = ev.evaluate(_cfg(eval_env, seed=3, languages=["en"], eval_tokens=64))
    b = ev.evaluate(_cfg(eval_env, seed=3, languages=["en"], eval_tokens=64, batch_size=1))
    c = ev.evaluate(_cfg(eval_env, seed=4, languages=["en"], eval_tokens=64))
    nll = lambda r: r["languages"]["en"]["random_init"]["nll_nats_total"]  # noqa: E731
    assert nll(a) == pytest.approx(nll(b), rel=1e-6) and nll(a) != nll(c)


# ---- multiple choice ---------------------------------------------------------------------------


def _uniform_model(vocab: int) -> LlamaForCausalLM:
    """lm_head = 0: every next-token distribution is uniform, log p = -ln V exactly."""
    model = LlamaForCausalLM(tiny_config(vocab_size=vocab))
    with torch.no_grad():
        model.lm_head.weight.zero_()
    return model.eval()


def _favouring_model(vocab: int, favoured: list[int], c: float) -> LlamaForCausalLM:
    """Context-free model: logit c for ``favoured`` tokens, 0 for the rest (attention/MLP outputs
    zeroed, constant embedding, so the final hidden state is the same at every position)."""
    model = _uniform_model(vocab)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.fill_(1.0)  # RMSNorm(ones) = ones / sqrt(1 + eps)
        scale = 1.0 / math.sqrt(1.0 + model.config.rms_norm_eps)
        model.lm_head.weight[favoured] = c / (32 * scale)
    return model


def test_continuation_logprobs_closed_form() -> None:
    V, S, c = 50, [5, 7, 9], 3.0
    model = _favouring_model(V, S, c)
    log_z = math.log(len(S) * math.exp(c) + V - len(S))
    pairs = [([2, 11], [5, 7]), ([2, 11, 12, 13], [20]), ([2], [9, 20, 21, 5])]
    want = [2 * (c - log_z), -log_z, 2 * (c - log_z) - 2 * log_z]
    got = mc.continuation_logprobs(model, pairs, torch.device("cpu"), max_len=64, batch_size=2)
    assert got == pytest.approx(want, abs=1e-4)
    # truncation from the left keeps the continuation scored in full
    long_ctx = ([2] + [11] * 100, [5])
    assert mc.continuation_logprobs(model, [long_ctx], torch.device("cpu"), max_len=64) == pytest.approx(
        [c - log_z], abs=1e-4
    )


def test_mc_accuracy_known_answer(eval_env, tmp_path) -> None:
    _, _, tok, vocab = eval_env
    model = _uniform_model(vocab)  # log-likelihood = -n_tokens * ln V
    items = [
        {"context": "Q: ", "choices": ["the lazy dog", "ab", "আমার সোনার বাংলা"], "answer": 0},
        {"context": "Q: ", "choices": ["Rome", "zq"], "answer": 1},
        {"context": "Q: ", "choices": ["gold", "zq"], "answer": 0},
    ]
    n_tok = lambda ctx, ch: len(mc.encode_choice(tok, ctx, ch, BOS)[1])  # noqa: E731
    exp_acc = exp_norm = 0
    for it in items:
        ll = [-n_tok(it["context"], ch) * math.log(vocab) for ch in it["choices"]]
        norm = [v / len(ch) for v, ch in zip(ll, it["choices"])]
        exp_acc += int(int(np.argmax(ll)) == it["answer"])  # np.argmax: first maximum, like score_mc
        exp_norm += int(int(np.argmax(norm)) == it["answer"])
    got = mc.score_mc(model, tok, items, torch.device("cpu"), max_len=64, prefix_id=BOS)
    assert got == {
        "n_items": 3,
        "acc": exp_acc / 3,
        "acc_norm": exp_norm / 3,
        "chance": pytest.approx((1 / 3 + 1 / 2 + 1 / 2) / 3),
    }
    assert got["acc"] != got["acc_norm"]  # the two criteria really differ on these items


def test_mc_favoured_answer_is_picked(eval_env) -> None:
    _, _, tok, vocab = eval_env
    items = [
        {"context": "x: ", "choices": ["dog", "আমার"], "answer": 1},
        {"context": "x: ", "choices": ["আমার", "fox"], "answer": 0},
    ]
    favoured = sorted(set(mc.encode_choice(tok, "x: ", "আমার", BOS)[1]))
    others = set(mc.encode_choice(tok, "x: ", "dog", BOS)[1]) | set(mc.encode_choice(tok, "x: ", "fox", BOS)[1])
    assert not others & set(favoured)
    model = _favouring_model(vocab, favoured, 5.0)
    got = mc.score_mc(model, tok, items, torch.device("cpu"), max_len=64, prefix_id=BOS)
    assert got["acc"] == 1.0 and got["acc_norm"] == 1.0


def test_read_mc_validates_and_accepts_hellaswag(tmp_path) -> None:
    good = tmp_path / "mc.jsonl"
    good.write_text(
        json.dumps({"context": "a", "choices": ["b", "c"], "answer": 1})
        + "\n\n"
        + json.dumps({"ctx": "A man", "endings": ["runs.", "sits."], "label": 0})
        + "\n"
    )
    items = mc.read_mc(good)
    assert items[1] == {"context": "A man", "choices": [" runs.", " sits."], "answer": 0}
    for line, match in [
        ("{bad", r"mc\.jsonl:1: not valid JSON"),
        (json.dumps({"context": "a", "choices": ["b", "c"], "answer": 2}), "answer"),
        (json.dumps({"context": "a", "choices": ["b"], "answer": 0}), "choices"),
    ]:
        (tmp_path / "mc.jsonl").write_text(line + "\n")
        with pytest.raises(ValueError, match=match):
            mc.read_mc(tmp_path / "mc.jsonl")
    with pytest.raises(FileNotFoundError):
        mc.read_mc(tmp_path / "missing.jsonl")


# ---- errors and the command line ----------------------------------------------------------------


def test_default_window_is_the_models_context(eval_env, tmp_path) -> None:
    """The default seq_len (0) scores with the checkpoint's whole context window: it was 512, which
    every model with a shorter window (the demo's 256) refused unless the user passed --seq-len."""
    from prodip.train.checkpoint import load_model

    context = load_model(eval_env[0])[1].max_position_embeddings
    assert context < 512
    got = ev.evaluate(_cfg(eval_env, seq_len=0, out=str(tmp_path / "eval.json")))
    assert got["config"]["seq_len"] == context
    same = ev.evaluate(_cfg(eval_env, seq_len=context, out=str(tmp_path / "eval2.json")))
    assert got["languages"] == same["languages"]


def test_bad_inputs_are_refused(eval_env, tmp_path) -> None:
    with pytest.raises(ValueError, match="seq_len=512 exceeds"):
        ev.evaluate(_cfg(eval_env, seq_len=512))
    with pytest.raises(ValueError, match="seq_len must be >= 0"):
        _cfg(eval_env, seq_len=-1)
    with pytest.raises(ValueError, match="languages"):
        ev.evaluate(_cfg(eval_env, languages=["xx"]))
    with pytest.raises(ValueError, match="nothing to score"):
        ev.evaluate(_cfg(eval_env, shards_dir=""))
    with pytest.raises(ValueError, match="eval_tokens"):
        _cfg(eval_env, eval_tokens=0)
    run, shards, _, _ = eval_env
    other = tmp_path / "shards"
    other.mkdir()
    meta = json.loads((shards / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "tokenizer_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="tokenizer sha256"):
        ev.evaluate(_cfg(eval_env, shards_dir=str(other)))


def test_prodip_eval_command(eval_env, tmp_path, capsys) -> None:
    from prodip.cli import main

    run, shards, _, _ = eval_env
    mc = tmp_path / "mc.jsonl"
    mc.write_text(json.dumps({"context": "Q: ", "choices": ["dog", "fox"], "answer": 0}) + "\n")
    toml = tmp_path / "eval.toml"
    toml.write_text(f'[eval]\nshards_dir = "{shards}"\neval_tokens = 100\nseq_len = 32\n')
    out = tmp_path / "e.json"
    rc = main(
        [
            "eval",
            "--config",
            str(toml),
            "--checkpoint",
            str(run),
            "--mc",
            str(mc),
            "--out",
            str(out),
            "--batch-size",
            "2",
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0 and "bits/char" in printed and "multiple choice (1 items" in printed
    result = json.loads(out.read_text())
    assert result["config"]["eval_tokens"] == 100 and result["config"]["batch_size"] == 2
    assert set(result["languages"]) == {"bn", "en"} and result["mc"]["trained"]["n_items"] == 1
    assert main(["eval", "--checkpoint", str(tmp_path / "nope"), "--shards-dir", str(shards)]) == 2


def test_language_without_validation_tokens_is_skipped(eval_env, tmp_path) -> None:
    import shutil

    from prodip.tokenizer.shards import write_shard

    _, shards, _, _ = eval_env
    other = tmp_path / "shards"
    shutil.copytree(shards, other)
    (other / "ta").mkdir()
    write_shard(other / "ta" / "val_000000.bin", np.zeros(0, dtype=np.int64), "uint16")
    meta = json.loads((other / "meta.json").read_text())
    meta["languages"]["ta"] = {"train": [], "val": [{"file": "ta/val_000000.bin", "n_tokens": 0}]}
    (other / "meta.json").write_text(json.dumps(meta))
    result = ev.evaluate(_cfg(eval_env, shards_dir=str(other), eval_tokens=64, out=str(tmp_path / "e.json")))
    assert "ta" not in result["languages"] and result["skipped_languages"] == {"ta": "no validation tokens"}
    assert result["languages"]["bn"]["tokens"] == 64
    assert "ta" in ev.format_table(result) and "skipped" in ev.format_table(result)
    with pytest.raises(ValueError, match="no validation tokens"):  # asked for explicitly: an error
        ev.evaluate(_cfg(eval_env, shards_dir=str(other), languages=["ta"], out=str(tmp_path / "f.json")))


def test_conflicting_mc_files_are_refused(tmp_path, capsys):
    from prodip.cli import main

    assert main(["eval", "--mc", str(tmp_path / "a.jsonl"), "--mc-file", str(tmp_path / "b.jsonl")]) == 2
    assert "two multiple-choice files given" in capsys.readouterr().err


def test_prodip_eval_refuses_an_eval_json_of_a_newer_prodip(eval_env, tmp_path, capsys) -> None:
    """`prodip eval --out` over an eval.json a newer prodip wrote: exit 2, one line naming the file and its
    format_version, the file unchanged."""
    from prodip.cli import main

    run, shards, _, _ = eval_env
    out = tmp_path / "eval.json"
    out.write_text(json.dumps({"format_version": 6, "languages": {}}))
    before = out.read_bytes()
    argv = ["eval", "--checkpoint", str(run), "--shards-dir", str(shards), "--out", str(out), "--eval-tokens", "64"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{out}: written by a newer prodip (format_version 6; this prodip reads 1)" in err
    assert out.read_bytes() == before


def test_baseline_scores_a_second_model_on_the_same_tokens(eval_env, tmp_path, tiny_tokenizer_dir) -> None:
    """--baseline: the run itself gives the trained figures exactly; a Hugging Face folder with the run's
    tokenizer gives transformers' own NLL over the same windows; another tokenizer is refused."""
    import shutil

    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HF

    from prodip.base.errors import InvalidInput, MissingInput
    from prodip.tokenizer.shards import read_shard

    run, shards, _, vocab = eval_env
    same = ev.evaluate(_cfg(eval_env, baseline=str(run), out=str(tmp_path / "same.json"), languages=["en"]))
    assert same["languages"]["en"]["baseline"] == same["languages"]["en"]["trained"]
    folder = tmp_path / "hf"
    torch.manual_seed(1)
    hf = HF(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            tie_word_embeddings=True,
        )  # fmt: skip
    ).eval()
    hf.save_pretrained(folder)
    shutil.copy(tiny_tokenizer_dir / "tokenizer.json", folder / "tokenizer.json")
    got = ev.evaluate(_cfg(eval_env, baseline=str(folder), out=str(tmp_path / "hf.json"), languages=["en"]))
    stream = torch.from_numpy(np.asarray(read_shard(shards / "en" / "val_000000.bin"), dtype=np.int64)[:301])
    total = 0.0
    with torch.no_grad():
        for s in range(0, 300, 64):  # the windows of eval: 64 targets each, each a fresh context
            window = stream[s : s + 65]
            logits = hf(window[:-1][None]).logits[0]
            total += F.cross_entropy(logits.double(), window[1:], reduction="sum").item()
    assert got["languages"]["en"]["baseline"]["nll_nats_total"] == pytest.approx(total, rel=1e-5)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(InvalidInput, match="--baseline .*: no tokenizer.json"):
        ev.evaluate(_cfg(eval_env, baseline=str(folder), out=str(tmp_path / "x.json"), languages=["en"]))
    # a baseline path that is not there is named as the option the user gave, not as --init-from
    with pytest.raises(MissingInput, match=r"^--baseline \S*nowhere: does not exist"):
        ev.evaluate(_cfg(eval_env, baseline=str(tmp_path / "nowhere"), out=str(tmp_path / "y.json"), languages=["en"]))


def test_documents_as_text_rebuild_the_shard_stream(eval_env, tiny_tokenizer_dir) -> None:
    """A baseline with its own tokenizer reads the scored documents as text: with the checkpoint's own tokenizer
    that text, re-encoded in the shard layout, is the shard's stream again, id for id (a cut last document too)."""
    from prodip.tokenizer.bpe import load_with_specials
    from prodip.tokenizer.shards import read_shard

    _, shards, _, _ = eval_env
    tok, specials = load_with_specials(tiny_tokenizer_dir)
    stream = np.asarray(read_shard(shards / "bn" / "val_000000.bin"), dtype=np.int64).tolist()
    docs = ev.stream_documents(tok, stream, doc_end=EOS, bos_id=BOS)
    assert [t for t, _ in docs[:4]] == DOCS["bn"] and all(ended for _, ended in docs)
    assert ev.text_stream(tok, specials, docs) == stream
    cut = stream[: stream.index(EOS, 30) - 3]  # the budget ends inside a document
    docs = ev.stream_documents(tok, cut, doc_end=EOS, bos_id=BOS)
    assert docs[-1][1] is False and any(d.startswith(docs[-1][0]) for d in DOCS["bn"])
    assert ev.text_stream(tok, specials, docs) == cut


def test_baseline_with_its_own_tokenizer_is_scored_on_the_same_text(eval_env, tmp_path) -> None:
    """--baseline a model with another tokenizer (the base before vocabulary extension): the same documents,
    encoded by transformers' tokenizer of that folder in its layout (SmolLM2: ``ids <|endoftext|>``, the first
    id context only), scored by transformers in the same windows; bits/char over that text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prodip.base.errors import InvalidInput
    from prodip.tokenizer.shards import read_shard
    from tests.standins import build_standin

    run, shards, tok, _ = eval_env
    base = build_standin("smollm2", tmp_path / "base")
    got = ev.evaluate(_cfg(eval_env, baseline=str(base), out=str(tmp_path / "own.json"), languages=["bn"]))
    row = got["languages"]["bn"]
    stream = np.asarray(read_shard(shards / "bn" / "val_000000.bin"), dtype=np.int64)[:301].tolist()
    docs = ev.stream_documents(tok, stream, doc_end=EOS, bos_id=BOS)
    hf_tok = AutoTokenizer.from_pretrained(str(base))
    end = hf_tok.convert_tokens_to_ids("<|endoftext|>")
    ids = [end]
    for text, ended in docs:
        ids += hf_tok(text, add_special_tokens=False)["input_ids"] + ([end] if ended else [])
    hf = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).eval()
    ids_t, total = torch.tensor(ids), 0.0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, 64):
            window = ids_t[s : s + 65]
            total += F.cross_entropy(hf(window[:-1][None]).logits[0].double(), window[1:], reduction="sum").item()
    b = row["baseline"]
    chars = sum(len(t) for t, _ in docs)
    assert (b["tokens"], b["chars"]) == (len(ids) - 1, chars)
    assert b["nll_nats_total"] == pytest.approx(total, rel=1e-5)
    assert b["bits_per_char"] == pytest.approx(total / math.log(2) / chars, rel=1e-5)
    # the English-trained base splits Bangla far finer than the checkpoint's tokenizer does
    assert b["chars_per_token"] < row["chars"] / row["tokens"]
    assert "own tokenizer" in ev.format_table(got)
    with pytest.raises(InvalidInput, match="compared on held-out text .* only"):
        ev.evaluate(_cfg(eval_env, baseline=str(base), out=str(tmp_path / "x.json"), tasks=["prodip_tatoeba_en2bn"]))
