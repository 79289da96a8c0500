"""/v1/chat/completions on a tiny chat export (tests.fixtures.build_tiny_chat_export): the prompt is the
chat contract's rendering (the same ids as transformers' apply_chat_template), greedy replies stop at the
planted end of turn <|im_end|>, the reply equals /v1/completions on the same ids (one machinery), n and
batch neighbours do not change a greedy reply, NFC, the chat logprobs shape, and each refusal."""

from __future__ import annotations

import json
import re
import unicodedata

import pytest

from tests.fixtures import CHAT_PROMPT
from tests.serve.conftest import LOCAL, make_verdict, wait_ready


@pytest.fixture(scope="session")
def chat_export(tmp_path_factory):
    """(export_dir, planted) of a tiny chat model (fp32 ONNX) with a passing conformance verdict."""
    from prodip import export
    from tests.fixtures import build_tiny_chat_export

    out, planted = build_tiny_chat_export(tmp_path_factory.mktemp("chat"), variants=["fp32"])
    export.set_conformance(out, make_verdict(out, {"fp32": True}))
    return out, planted


@pytest.fixture(scope="module")
def chat_client(chat_export):
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app

    with TestClient(create_app(chat_export[0], "fp32", batch_wait_ms=2.0), base_url=LOCAL) as c:
        wait_ready(c)
        yield c


def _chat(client, **body):
    r = client.post("/v1/chat/completions", json={"messages": CHAT_PROMPT, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_prompt_ids_are_transformers_apply_chat_template(chat_export, chat_client):
    """usage.prompt_tokens and /tokenize of the rendering equal transformers' own template ids."""
    from transformers import AutoTokenizer

    from prodip.base.chat import render

    want = AutoTokenizer.from_pretrained(chat_export[0]).apply_chat_template(
        CHAT_PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert want == chat_export[1]["prompt_ids"]
    got = chat_client.post("/tokenize", json={"prompt": render(CHAT_PROMPT), "add_special_tokens": False}).json()
    assert got["tokens"] == want
    body = _chat(chat_client, max_tokens=8)
    assert body["usage"]["prompt_tokens"] == len(want)


def test_greedy_reply_stops_at_end_of_turn(chat_export, chat_client):
    planted = chat_export[1]
    body = _chat(chat_client, max_tokens=10)
    (choice,) = body["choices"]
    assert body["object"] == "chat.completion" and choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == len(planted["reply_ids"])  # the end of turn included
    text = chat_client.post("/detokenize", json={"tokens": planted["reply_ids"]}).json()["prompt"]
    assert choice["message"]["content"] == text
    # ignore_eos: the same first tokens, then on past the end of turn to max_tokens
    longer = _chat(chat_client, max_tokens=10, ignore_eos=True)["choices"][0]
    assert longer["finish_reason"] == "length"


def test_same_reply_as_completions_on_the_rendered_ids(chat_export, chat_client):
    """One machinery: /v1/completions on the rendered prompt's ids gives the same text and logprobs."""
    ids = chat_export[1]["prompt_ids"]
    comp = chat_client.post(
        "/v1/completions", json={"prompt": ids, "max_tokens": 10, "temperature": 0, "logprobs": 2}
    ).json()["choices"][0]
    chat = _chat(chat_client, max_tokens=10, logprobs=True, top_logprobs=2)["choices"][0]
    assert chat["message"]["content"] == comp["text"] and chat["finish_reason"] == comp["finish_reason"]
    content = chat["logprobs"]["content"]
    assert [c["token"] for c in content] == comp["logprobs"]["tokens"]
    assert [c["logprob"] for c in content] == comp["logprobs"]["token_logprobs"]
    for c, top in zip(content, comp["logprobs"]["top_logprobs"]):
        assert len(c["top_logprobs"]) == 2
        assert [t["logprob"] for t in c["top_logprobs"]] == sorted(top.values(), reverse=True)[:2]
        assert bytes(c["bytes"]).decode("utf-8", "replace") == c["token"] or c["token"].startswith("bytes:")


def test_n_and_streaming_join_to_the_whole_answer(chat_client):
    whole = _chat(chat_client, max_tokens=10, n=3)
    texts = {c["message"]["content"] for c in whole["choices"]}
    assert len(texts) == 1  # greedy: batch neighbours do not change a row
    (text,) = texts
    r = chat_client.post(
        "/v1/chat/completions",
        json={
            "messages": CHAT_PROMPT,
            "temperature": 0,
            "max_tokens": 10,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = [
        json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"
    ]
    assert r.text.rstrip().endswith("data: [DONE]")
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    for i in range(2):
        mine = [e["choices"][0] for e in events if e["choices"] and e["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in mine) == text
        assert mine[-1]["finish_reason"] == "stop" and mine[-1]["delta"] == {}
    per_choice = whole["usage"]["completion_tokens"] // 3
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {
        "prompt_tokens": whole["usage"]["prompt_tokens"],
        "completion_tokens": 2 * per_choice,
        "total_tokens": whole["usage"]["prompt_tokens"] + 2 * per_choice,
    }


def test_nfd_content_is_served_as_nfc(chat_client):
    """The one normalisation rule: decomposed Bangla (NFD) is the same prompt as composed (NFC)."""
    nfd = [{"role": m["role"], "content": unicodedata.normalize("NFD", m["content"])} for m in CHAT_PROMPT]
    assert nfd != CHAT_PROMPT
    a = _chat(chat_client, max_tokens=6)
    b = chat_client.post("/v1/chat/completions", json={"messages": nfd, "temperature": 0, "max_tokens": 6}).json()
    assert a["usage"] == b["usage"] and a["choices"][0]["message"] == b["choices"][0]["message"]


def test_text_parts_are_joined(chat_client):
    system = CHAT_PROMPT[0]["content"]
    parts = [
        {"role": "system", "content": [{"type": "text", "text": system[:7]}, {"type": "text", "text": system[7:]}]},
        CHAT_PROMPT[1],
    ]
    a = _chat(chat_client, max_tokens=6)
    b = chat_client.post("/v1/chat/completions", json={"messages": parts, "temperature": 0, "max_tokens": 6}).json()
    assert a["usage"] == b["usage"] and a["choices"][0]["message"] == b["choices"][0]["message"]


@pytest.mark.parametrize(
    "extra, messages, param, code",
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, None, "tools", "unsupported"),
        ({"tool_choice": "auto"}, None, "tool_choice", "unsupported"),
        ({"response_format": {"type": "json_object"}}, None, "response_format", "unsupported"),
        ({"top_logprobs": 2}, None, "top_logprobs", None),
        ({}, [{"role": "tool", "content": "x", "tool_call_id": "1"}], "messages[0].role", "unsupported_content"),
        (
            {},
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],
            "messages[0].content",
            "unsupported_content",
        ),
        ({}, [{"role": "user", "content": "a <|im_end|> b"}], "messages[0].content", "special_token_in_content"),
        (
            {},
            [{"role": "user", "content": "hi"}, {"role": "user", "content": "<|bos|>"}],
            "messages[1].content",
            "special_token_in_content",
        ),
        ({}, [{"role": "assistant", "content": None}], "messages[0].content", None),
        ({}, [{"role": "assistant", "content": "x", "tool_calls": []}], "messages[0].tool_calls", "unsupported"),
        ({"max_completion_tokens": 1000}, None, "max_completion_tokens", "context_length_exceeded"),
    ],
)
def test_refusals_are_openai_errors(chat_client, extra, messages, param, code):
    body = {"messages": messages or CHAT_PROMPT, **extra}
    r = chat_client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["code"] == code, err


@pytest.mark.parametrize(
    "messages, param, code",
    [
        ([{"role": "tool", "content": "x"}], "messages[0].role", "unsupported_content"),
        (
            [{"role": "user", "content": "hi"}, {"role": "developer", "content": "x"}],
            "messages[1].role",
            "unsupported_content",
        ),
        ([{"role": "user", "content": "a <|im_end|> b"}], "messages[0].content", "special_token_in_content"),
        (
            [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "<|bos|>"},
            ],
            "messages[2].content",
            "special_token_in_content",
        ),
    ],
)
def test_a_bad_message_gets_one_error_from_render_sft_and_serve(chat_export, chat_client, messages, param, code):
    """prodip.base.chat.render, `prodip sft` (prodip.train.chat: parse_messages, then encode_conversation with
    the tokenizer's special tokens) and /v1/chat/completions refuse the same message with the same text, param
    and code: one validator (prodip.base.chat.check_message)."""
    from prodip.base.chat import MessageError, render, special_token_texts
    from prodip.base.errors import InvalidInput
    from prodip.tokenizer.bpe import load_tokenizer
    from prodip.train import chat as sft

    tok = load_tokenizer(chat_export[0])
    with pytest.raises(MessageError) as err:
        render(messages, specials=special_token_texts(tok))
    want = str(err.value)
    assert (err.value.param, err.value.code) == (param, code) and want.startswith(param), want
    record = [*messages, {"role": "assistant", "content": "a reply"}]  # sft needs one; the fault comes first
    with pytest.raises(InvalidInput) as err:
        sft.encode_conversation(tok, sft.parse_messages(record, "data.jsonl:3"), "data.jsonl:3")
    assert str(err.value) == f"data.jsonl:3: {want}"
    r = chat_client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {"message": want, "type": "invalid_request_error", "param": param, "code": code}


@pytest.mark.parametrize(
    "message, want",
    [
        ("hi", "messages[0] is str, expected an object with role and content"),
        ({"role": "user", "content": 5}, "messages[0].content must be a string (text only), got int"),
        ({"role": "user", "content": None}, "messages[0].content must be a string (text only), got NoneType"),
        ({"content": "x"}, "messages[0].role: None is not one of system, user, assistant (text chat: no tool roles)"),
        (
            {"role": "user", "content": "ab\udc80"},
            "messages[0].content holds a lone surrogate (U+DC80) at character 2: not Unicode text",
        ),
    ],
)
def test_render_and_sft_refuse_a_malformed_message_alike(message, want):
    """What a JSON request cannot send past serve's schema (which types each field first and refuses any lone
    surrogate naming the field): render and `prodip sft` give the one validator's error, word for word."""
    from prodip.base.chat import MessageError, render
    from prodip.base.errors import InvalidInput
    from prodip.train import chat as sft

    with pytest.raises(MessageError) as err:
        render([message])
    assert str(err.value).startswith(want), str(err.value)
    with pytest.raises(InvalidInput) as err2:
        sft.parse_messages([message, {"role": "assistant", "content": "a"}], "x.jsonl:1")
    assert str(err2.value) == f"x.jsonl:1: {err.value}"


def test_empty_messages_and_stream_options_without_stream(chat_client):
    for body in ({"messages": []}, {"messages": CHAT_PROMPT, "stream_options": {"include_usage": True}}):
        r = chat_client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text


def test_template_advertised(chat_client):
    from prodip.base.chat import CHAT_TEMPLATE

    assert chat_client.get("/tokenizer_info").json()["chat_template"] == CHAT_TEMPLATE


# ---- a real `prodip serve`: the openai client (docs/serving.md's example verbatim) and lm-evaluation-harness ----


@pytest.fixture(scope="module")
def chat_server(chat_export):
    from tests.serve.conftest import serve_export

    with serve_export(chat_export[0], "--log-level", "warning") as srv:
        yield srv.base


def readme_chat_example() -> str:
    """docs/serving.md's `openai` chat example (its python block using chat.completions)."""
    import re

    from tests.serve.test_lm_eval import REPO

    text = (REPO / "docs" / "serving.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "chat.completions.create" in b]
    assert len(blocks) == 1, "docs/serving.md must hold one python block with the openai chat example"
    return blocks[0]


def _hf_greedy_reply(export_dir, messages, max_new_tokens: int) -> str:
    """transformers' own template + generate (its generation_config.json: stops at any eos id)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(export_dir)
    model = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32).eval()
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.mark.slow
def test_readme_openai_chat_example_runs(chat_export, chat_server):
    """docs/serving.md's example, verbatim but for the port, against a real server: the reply is
    transformers' greedy reply to the same messages (stopped at <|im_end|>), and streamed joins to it."""
    import subprocess
    import sys

    code = readme_chat_example().replace("http://127.0.0.1:8000", chat_server)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    import openai

    client = openai.OpenAI(base_url=f"{chat_server}/v1", api_key="unused", max_retries=0)
    msgs = json.loads(re.sub(r",\s*\]$", "]", re.search(r"messages = (\[.*?\n\])\n", code, re.S).group(1)))
    assert msgs == CHAT_PROMPT  # the planted conversation: its greedy reply ends its turn
    reply = client.chat.completions.create(model="export", messages=msgs, max_tokens=32, temperature=0)
    assert lines == [repr(reply.choices[0].message.content), "stop", "True"], lines
    assert reply.choices[0].message.content == _hf_greedy_reply(chat_export[0], msgs, 32)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="export", messages=msgs, tools=[{"type": "function", "function": {"name": "f"}}]
        )
    assert err.value.body["code"] == "unsupported"


@pytest.mark.slow
def test_lm_eval_local_chat_completions(chat_export, chat_server, tmp_path):
    """lm-evaluation-harness's `local-chat-completions` with serve/README.md's command line (port and
    task substituted): its generations equal transformers' greedy chat replies to the same messages."""
    pytest.importorskip("lm_eval")
    import os
    import shlex
    import subprocess
    import sys

    from tests.fixtures import CHAT_PROMPT
    from tests.serve.test_lm_eval import REPO

    text = (REPO / "serve" / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^lm_eval --model local-chat-completions.*?(?<!\\)$", text, re.S | re.M)
    assert m, "serve/README.md has no `lm_eval --model local-chat-completions` command"
    cmd = shlex.split(m.group(0).replace("\\\n", " "))
    cmd[:1] = [sys.executable, "-m", "lm_eval"]  # the lm_eval of this interpreter
    cmd[cmd.index("--model_args") + 1] = cmd[cmd.index("--model_args") + 1].replace(
        "http://127.0.0.1:8000", chat_server
    )
    docs = [{"q": CHAT_PROMPT[1]["content"]}, {"q": "Where is Dhaka?"}, {"q": "ঢাকা কোথায়? Where?"}]
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    (tmp_path / "tiny_chat.yaml").write_text(
        f"task: tiny_chat\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        "output_type: generate_until\ndoc_to_text: '{{q}}'\ndoc_to_target: ''\n"
        "generation_kwargs:\n  until: ['\\n\\n\\n']\n  max_gen_toks: 12\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n",
        encoding="utf-8",
    )
    cmd[cmd.index("--tasks") + 1] = "tiny_chat"
    extra = ["--include_path", str(tmp_path), "--log_samples", "--output_path", str(tmp_path / "out")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    r = subprocess.run(cmd + extra, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"{shlex.join(cmd + extra)}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    samples = [
        json.loads(x) for x in next((tmp_path / "out").rglob("samples_tiny_chat_*.jsonl")).read_text().splitlines()
    ]
    system = cmd[cmd.index("--system_instruction") + 1]
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": docs[s["doc_id"]]["q"]}]
        assert s["resps"][0][0] == _hf_greedy_reply(chat_export[0], msgs, 12), s


class _Held:
    """Stands in for a slow step (tokenising or rendering a huge request): ``call`` enters, then waits until
    the test releases it (at most 30 s), then does the real work. Were the step on the event loop, the
    loop would wait with it, and no other request could be answered meanwhile."""

    def __init__(self, real):
        import threading

        self.real, self.entered, self.release = real, threading.Event(), threading.Event()

    def __call__(self, *args, **kwargs):
        self.entered.set()
        assert self.release.wait(30), "never released: the test's other request was not answered"
        return self.real(*args, **kwargs)


class _HeldTokenizer:
    def __init__(self, tok):
        self._tok, self.encode_batch, self.decode_batch = tok, _Held(tok.encode_batch), _Held(tok.decode_batch)

    def __getattr__(self, name):
        return getattr(self._tok, name)


@pytest.mark.parametrize(
    "held, path, body",
    [
        ("render", "/v1/chat/completions", {"messages": CHAT_PROMPT, "max_tokens": 1, "temperature": 0}),
        ("encode_batch", "/v1/chat/completions", {"messages": CHAT_PROMPT, "max_tokens": 1, "temperature": 0}),
        ("encode_batch", "/v1/completions", {"prompt": "আমি", "max_tokens": 1, "temperature": 0}),
        ("encode_batch", "/v1/generate", {"prompt": "আমি", "max_new_tokens": 1, "temperature": 0}),
        ("encode_batch", "/tokenize", {"prompt": "আমি"}),
        ("decode_batch", "/detokenize", {"tokens": [5, 6, 7]}),
    ],
)
def test_slow_tokenising_or_rendering_does_not_block_other_requests(chat_client, monkeypatch, held, path, body):
    """While one request's template rendering or tokenising is held, /health is answered, and the held
    request then gets its ordinary answer: that work runs in a worker thread, not on the event loop."""
    import threading

    import prodip.serve.service as service

    svc = chat_client.app.state.service
    expected = chat_client.post(path, json=body).json()
    if held == "render":
        step = _Held(service.render)
        monkeypatch.setattr(service, "render", step)
    else:
        monkeypatch.setattr(svc, "tokenizer", _HeldTokenizer(svc.tokenizer))
        step = getattr(svc.tokenizer, held)
    got = {}
    worker = threading.Thread(target=lambda: got.setdefault("r", chat_client.post(path, json=body)))
    worker.start()
    try:
        assert step.entered.wait(30), got.get("r") and got["r"].text
        probe = threading.Thread(target=lambda: got.setdefault("health", chat_client.get("/health")))
        probe.start()
        probe.join(20)
        assert "health" in got and got["health"].status_code == 200, "/health waited for the held request"
    finally:
        step.release.set()
        worker.join(30)
    assert got["r"].status_code == 200, got["r"].text
    reply = got["r"].json()
    for key in ("id", "created"):
        reply.pop(key, None), expected.pop(key, None)
    assert reply == expected  # the held request's answer is the ordinary one


def test_the_tokenizer_lets_other_threads_run_while_it_encodes(chat_client):
    """Service.encode/decode release the GIL (tokenizers' encode holds it for the whole text: a worker thread
    alone would not free the event loop). The main thread sleeps in 20 ms steps while a worker encodes ~900 KB;
    holding the GIL would let it wake at most once or twice before the encode ends."""
    import threading
    import time

    svc = chat_client.app.state.service
    big = "আমি বাংলায় গান গাই। " * 16000  # ~900 KB of UTF-8
    done, ids = threading.Event(), []
    worker = threading.Thread(target=lambda: (ids.extend(svc.encode(big)), done.set()))
    t0 = time.monotonic()
    worker.start()
    wakes = 0
    while not done.is_set():
        time.sleep(0.02)
        wakes += 1
    took = time.monotonic() - t0
    worker.join()
    assert ids == svc.tokenizer.encode(big).ids
    assert took < 0.2 or wakes >= took / 0.02 / 4, (wakes, took)  # (a fast machine: nothing to measure)
    assert svc.decode(ids[:50]) == svc.tokenizer.decode(ids[:50])


@pytest.mark.slow
def test_lm_eval_chat_tasks_of_docs_eval_md_against_serve(chat_export, chat_server, tmp_path):
    """docs/eval.md's `local-chat-completions` command (port and item count substituted) on the bundled chat
    tasks: every reply the server gave equals prodip's in-process greedy reply (``prodip.train.lmeval``) on the
    same export's fp32 ONNX session, through the same template."""
    pytest.importorskip("lm_eval")
    import os
    import shlex
    import subprocess
    import sys

    from prodip.conformance.runners import OrtRunner
    from prodip.tokenizer.bpe import load_tokenizer
    from prodip.train import lmeval
    from tests.serve.test_lm_eval import REPO

    text = (REPO / "docs" / "eval.md").read_text(encoding="utf-8")
    m = re.search(r"^lm_eval --model local-chat-completions.*?(?<!\\)$", text, re.S | re.M)
    assert m, "docs/eval.md has no `lm_eval --model local-chat-completions` command"
    cmd = shlex.split(m.group(0).replace("\\\n", " "))
    cmd[:1] = [sys.executable, "-m", "lm_eval"]
    args = cmd.index("--model_args") + 1
    cmd[args] = cmd[args].replace("http://127.0.0.1:8000", chat_server)
    cmd[cmd.index("--limit") + 1] = "5"
    extra = ["--log_samples", "--output_path", str(tmp_path / "out")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    r = subprocess.run(cmd + extra, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert r.returncode == 0, f"{shlex.join(cmd + extra)}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"

    export = chat_export[0]
    tok, chat = load_tokenizer(export), lmeval.chat_format(export)
    cfg = json.loads((export / "config.json").read_text())
    ort = OrtRunner(
        export / "onnx" / "model.onnx",
        "fp32",
        num_layers=cfg["num_hidden_layers"],
        num_kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["hidden_size"] // cfg["num_attention_heads"],
        threads=1,
    )
    asks = {
        "prodip_tatoeba_chat_en2bn": "Translate into Bangla: {en}",
        "prodip_tatoeba_chat_bn2en": "ইংরেজিতে অনুবাদ করো: {bn}",
    }
    replies: list[str] = []
    for task, ask in asks.items():
        samples = [
            json.loads(x) for x in next((tmp_path / "out").rglob(f"samples_{task}_*.jsonl")).read_text().splitlines()
        ]
        assert len(samples) == 5
        for s in samples:
            prompt = chat.render([{"role": "user", "content": ask.format(**s["doc"])}])
            (ours,) = lmeval.greedy_until(
                ort.forward,
                [tok.encode(prompt, add_special_tokens=False).ids],
                max_new=[32],
                stop_ids={chat.end_of_turn_id, cfg["eos_token_id"]},
                until=[["\n"]],
                decode=lambda ids: tok.decode(list(ids), skip_special_tokens=True),
                max_length=cfg["max_position_embeddings"],
                batch_size=1,
            )
            assert s["resps"][0][0] == ours, (task, s["doc_id"])
            replies.append(ours)
    assert sum(bool(x) for x in replies) >= 5, replies  # the comparison is of real text


def test_end_of_turn_is_spelled_one_way_and_found_among_its_alternatives(chat_export, chat_client):
    """The sampled <|im_end|> is "<|im_end|>" in tokens, in its own top_logprobs and in chat logprobs, with the
    same logprob there (lm-eval's is_greedy: the chosen token is the top alternative); every other step too."""
    planted = chat_export[1]
    ids = planted["prompt_ids"]
    comp = chat_client.post(
        "/v1/completions", json={"prompt": ids, "max_tokens": 10, "temperature": 0, "logprobs": 3}
    ).json()["choices"][0]
    lp = comp["logprobs"]
    assert lp["tokens"][-1] == "<|im_end|>" and len(lp["tokens"]) == len(planted["reply_ids"])
    for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert top[tok] == value and max(top, key=top.get) == tok  # greedy: chosen == top, one spelling
    chat = _chat(chat_client, max_tokens=10, logprobs=True, top_logprobs=3)["choices"][0]
    content = chat["logprobs"]["content"]
    assert [c["token"] for c in content] == lp["tokens"] and content[-1]["token"] == "<|im_end|>"
    for c in content:
        alternatives = {t["token"]: t["logprob"] for t in c["top_logprobs"]}
        assert alternatives[c["token"]] == c["logprob"]
    assert bytes(content[-1]["bytes"]) == b"<|im_end|>"
    # the echoed prompt names its specials the same way: <|bos|> <|im_start|> ... as the tokenizer does
    echo = chat_client.post(
        "/v1/completions", json={"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1}
    ).json()["choices"][0]["logprobs"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(chat_export[0] / "tokenizer.json"))
    specials = {i for i in ids if tok.id_to_token(i).startswith("<|")}
    assert specials and all(echo["tokens"][k] == tok.id_to_token(i) for k, i in enumerate(ids) if i in specials)


def test_vllm_chat_extras(chat_export, chat_client):
    """add_generation_prompt, continue_final_message and chat_template_kwargs on chat and /tokenize, with
    transformers' apply_chat_template as the reference for the ids."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(chat_export[0])
    convo = [*CHAT_PROMPT, {"role": "assistant", "content": "ab"}]
    for body, kw in [
        ({}, {"add_generation_prompt": True}),
        ({"add_generation_prompt": False}, {"add_generation_prompt": False}),
        ({"add_generation_prompt": False, "continue_final_message": True}, {"continue_final_message": True}),
    ]:
        messages = convo if kw.get("continue_final_message") else CHAT_PROMPT
        want = hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kw)
        r = chat_client.post("/tokenize", json={"messages": messages, "return_token_strs": True, **body})
        assert r.status_code == 200, r.text
        assert r.json()["tokens"] == want and r.json()["count"] == len(want), body
        chat = _chat(chat_client, messages=messages, max_tokens=2, **body)
        assert chat["usage"]["prompt_tokens"] == len(want)
    # the continued message's reply is /v1/completions on those ids
    cont = hf.apply_chat_template(convo, tokenize=True, return_dict=False, continue_final_message=True)
    comp = chat_client.post("/v1/completions", json={"prompt": cont, "max_tokens": 4, "temperature": 0}).json()
    chat = _chat(chat_client, messages=convo, max_tokens=4, add_generation_prompt=False, continue_final_message=True)
    assert chat["choices"][0]["message"]["content"] == comp["choices"][0]["text"]
    # chat_template_kwargs: variables prodip's template does not read change nothing; its own names are refused
    plain = chat_client.post("/tokenize", json={"messages": CHAT_PROMPT}).json()["tokens"]
    kwargs = chat_client.post("/tokenize", json={"messages": CHAT_PROMPT, "chat_template_kwargs": {"x": 1}})
    assert kwargs.json()["tokens"] == plain
    for body, param in [
        ({"continue_final_message": True}, "continue_final_message"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs.add_generation_prompt"),
    ]:
        for path in ("/v1/chat/completions", "/tokenize"):
            r = chat_client.post(path, json={"messages": CHAT_PROMPT, **body})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)
    r = chat_client.post("/tokenize", json={"messages": CHAT_PROMPT, "prompt": "x"})
    assert r.status_code == 400 and "exactly one of prompt" in r.text


def test_stop_strings_in_either_form(chat_client):
    """Case C2 on chat: ো as the stop string, in either form, cuts each of n replies before its first ো
    whichever form the model wrote it in, streamed or not (tests/serve/test_stop_forms.py's check)."""
    from tests.serve.test_stop_forms import check_both_forms, forcing_bias

    bias = forcing_bias(chat_client.app.state.service.tokenizer)
    base = {"messages": CHAT_PROMPT, "max_tokens": 24, "temperature": 1.0, "seed": 0, "n": 2, "logit_bias": bias}

    def post(extra):
        r = chat_client.post("/v1/chat/completions", json={**base, **extra})
        assert r.status_code == 200, r.text
        return r

    check_both_forms(post, lambda c: c["message"]["content"], lambda c: c["delta"].get("content"))
