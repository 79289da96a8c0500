"""CPU before/after figures of issue 16 at the 0.4B size (configs/h100-0.4b.toml's model).

Three measurements, each printing one JSON object (``--json`` also writes it):

- ``save``: the 0.4B model (395.9 M parameters) with AdamW state (4.75 GB of checkpoint). Before:
  the blocking save the trainer used to make (every file written, read back and hashed, fsynced),
  reproduced with ``safetensors.torch.save_file``; after: ``prodip.train.saver.AsyncCheckpointer``,
  whose ``save`` returns once the state is in host buffers. Reported: seconds the calling
  (training) thread is held per save (the stall), and how long the background write took.
- ``loss-head``: peak resident memory (MiB, ``VmHWM`` after resetting it through
  ``/proc/self/clear_refs``) of the final norm + lm_head + cross-entropy forward and backward
  for ``--tokens`` tokens (D=1024, V=32000). Before: ``F.cross_entropy(lm_head(h).float(), y)``;
  after: ``prodip.train.loss.linear_cross_entropy`` at ``--chunks`` tokens per chunk. fp32 on
  CPU by default (``--bf16`` for bf16 autocast: emulated on CPUs without bf16 units, very slow).
- ``gqa``: bytes autograd saves for backward in one attention core (SDPA, 16 query / 8 KV heads,
  Dh 64, ``--tokens`` tokens, bf16 autocast): K/V repeated to 16 heads (before) against
  ``enable_gqa=True`` (after); counted by ``torch.autograd.graph.saved_tensors_hooks``.

    python bench/train_perf_cpu.py save --tokenizer-dir runs/demo/tokenizer --repeats 3
    python bench/train_perf_cpu.py loss-head --tokens 2048 --chunks 4096 512
    python bench/train_perf_cpu.py gqa --tokens 2048
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from prodip.base.files import file_sha256
from prodip.train import checkpoint as ck
from prodip.train.config import ModelConfig
from prodip.train.loop import build_optimizer
from prodip.train.loss import linear_cross_entropy
from prodip.train.model import LlamaForCausalLM, LlamaRMSNorm
from prodip.train.records import CheckpointManifest
from prodip.train.saver import AsyncCheckpointer

MODEL_0P4B = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    max_position_embeddings=2048,
)


def _rss(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_mib(fn) -> float:
    """Peak resident memory (MiB) that ``fn()`` adds on top of what the process holds already."""
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    base = _rss("VmRSS:")
    fn()
    return (_rss("VmHWM:") - base) / 2**20


def blocking_save(root: Path, step: int, model, cfg: ModelConfig, opt, tok: Path) -> None:
    """The save as the trainer made it before issue 16 (safetensors.save_file, then read back to hash)."""
    snap = ck.take_snapshot(model, cfg.tie_word_embeddings, opt)
    tmp = root / f".tmp_{step}"
    tmp.mkdir(parents=True)
    save_file(snap.model, str(tmp / ck.MODEL_FILE), metadata={"format": "pt"})
    save_file(snap.optimizer, str(tmp / ck.OPTIMIZER_FILE), metadata={"optimizer": snap.optimizer_meta})
    save_file(snap.rng, str(tmp / ck.RNG_FILE))
    files = {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in sorted(tmp.iterdir())}
    CheckpointManifest.from_dict({"format_version": ck.FORMAT_VERSION, "files": files}).write(tmp / ck.MANIFEST_FILE)
    for p in tmp.iterdir():
        with open(p, "rb+") as fh:
            os.fsync(fh.fileno())
    tmp.rename(root / f"step_{step}")


def next_step(model, opt, tokens: int) -> float:
    """One training step (forward, backward, AdamW) on ``tokens`` tokens; seconds."""
    start = time.perf_counter()
    x = torch.randint(0, model.config.vocab_size, (1, tokens))
    model(x, labels=x).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def bench_save(args) -> dict:
    cfg = ModelConfig(**MODEL_0P4B)
    model = LlamaForCausalLM(cfg)
    opt = build_optimizer(model, lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, device=torch.device("cpu"))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # AdamW moments exist, as in a running job
    opt.zero_grad(set_to_none=True)
    out = {"parameters": model.num_parameters(), "before_stall_s": [], "after_stall_s": [], "after_write_s": []}
    out["after_next_step_s"], out["next_tokens"] = [], args.next_tokens
    kwargs = dict(tokenizer_dir=args.tokenizer_dir, tokens_seen=0, train_config={}, data_state={}, keep_last=1)
    with tempfile.TemporaryDirectory(dir=args.tmp) as d:
        saver = AsyncCheckpointer(Path(d) / "after")
        if args.only in (None, "after") and not args.no_prepare:
            # as the trainer does after its first step: the save's host buffers are allocated in the
            # background while training goes on; the first save then finds them ready
            t0 = time.perf_counter()
            saver.prepare(model=model, tie_word_embeddings=cfg.tie_word_embeddings, optimizer=opt)
            out["prepare_call_s"] = time.perf_counter() - t0
            out["step_during_prepare_s"] = next_step(model, opt, args.next_tokens)
            saver.wait()
            out["prepare_total_s"] = time.perf_counter() - t0
            out["next_step_alone_s"] = next_step(model, opt, args.next_tokens)
        for i in range(args.repeats):
            if args.only in (None, "before"):
                t0 = time.perf_counter()
                blocking_save(Path(d) / "before", i, model, cfg, opt, Path(args.tokenizer_dir))
                out["before_stall_s"].append(time.perf_counter() - t0)
                for old in (Path(d) / "before").glob("step_*"):
                    shutil.rmtree(old)
            if args.only in (None, "after"):
                stall = saver.save(step=i + 1, model=model, model_config=cfg, optimizer=opt, **kwargs)
                step_s = next_step(model, opt, args.next_tokens)  # training goes on during the write
                held = saver.pop_held_s()  # optimizer.step held until the snapshot copy was complete
                out["after_stall_s"].append(stall + held)
                out["after_next_step_s"].append(step_s)
                saver.wait()
                out["after_write_s"].append(saver.last_write_s)
        saver.close()
        out["checkpoint_bytes"] = sum(
            p.stat().st_size for p in (Path(d) / "after").rglob("*") if p.is_file() and "step_" in str(p)
        )
    for key in ("before_stall_s", "after_stall_s", "after_write_s", "after_next_step_s"):
        if out[key]:
            out[key[: -len("_s")] + "_median_s"] = statistics.median(out[key])
    return out


def bench_loss_head(args) -> dict:
    torch.manual_seed(0)
    D, V = 1024, 32000
    norm, head = LlamaRMSNorm(D, 1e-5), torch.nn.Linear(D, V, bias=False)
    h = torch.randn(1, args.tokens, D, requires_grad=True)
    y = torch.randint(0, V, (1, args.tokens))

    def run(chunk):
        def f():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                if chunk is None:
                    loss = F.cross_entropy(head(norm(h)).flatten(0, 1).float(), y.flatten())
                else:
                    loss = linear_cross_entropy(norm(h), head.weight, y, chunk)
            loss.backward()
            h.grad = head.weight.grad = norm.weight.grad = None

        return f

    out = {"tokens": args.tokens, "dtype": "bf16 autocast" if args.bf16 else "fp32", "peak_mib": {}}
    for chunk in [None, *args.chunks]:
        name = "before" if chunk is None else f"chunk_{chunk}"
        out["peak_mib"][name] = [round(peak_mib(run(chunk)), 1) for _ in range(args.repeats)]
        print(name, out["peak_mib"][name], flush=True)
    return out


def bench_gqa(args) -> dict:
    B, H, Hkv, Dh, T = 1, 16, 8, 64, args.tokens
    q = torch.randn(B, H, T, Dh, requires_grad=True)
    k = torch.randn(B, Hkv, T, Dh, requires_grad=True)
    v = torch.randn(B, Hkv, T, Dh, requires_grad=True)

    def saved(fn):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = (tuple(t.shape), t.untyped_storage().nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                o = fn()
        o.sum().backward()
        return {"saved_mib": sum(n for _, n in seen.values()) / 2**20, "shapes": sorted(s for s, _ in seen.values())}

    rep = lambda: F.scaled_dot_product_attention(  # noqa: E731
        q, k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1), is_causal=True
    )
    gqa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    return {"tokens": T, "heads": [H, Hkv], "before": saved(rep), "after": saved(gqa)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("save")
    s.add_argument("--tokenizer-dir", required=True)
    s.add_argument("--tmp", default=None, help="folder for the temporary checkpoints (a real disk)")
    s.add_argument("--only", choices=("before", "after"), help="one side (each needs ~10 GB of RAM)")
    s.add_argument(
        "--no-prepare", action="store_true", help="after: no AsyncCheckpointer.prepare (the first save allocates)"
    )
    s.add_argument("--next-tokens", type=int, default=64, help="tokens of the training step run during a save")
    lh = sub.add_parser("loss-head")
    lh.add_argument("--tokens", type=int, default=2048)
    lh.add_argument("--chunks", type=int, nargs="*", default=[4096, 512])
    lh.add_argument("--bf16", action="store_true")
    g = sub.add_parser("gqa")
    g.add_argument("--tokens", type=int, default=2048)
    for p in (s, lh, g):
        p.add_argument("--repeats", type=int, default=2)
        p.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    result = {"save": bench_save, "loss-head": bench_loss_head, "gqa": bench_gqa}[args.what](args)
    result = {"what": args.what, "torch": torch.__version__, "threads": torch.get_num_threads(), **result}
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
