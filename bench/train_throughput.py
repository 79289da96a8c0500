"""Training throughput: the prodip trainer vs a bare forward/backward/step loop, same model and batch.

Both run in this process on the same ModelConfig, batch shape, accumulation, dtype/autocast and
(optional) torch.compile. The bare loop is the minimal nanoGPT-style loop: forward, loss / N,
backward per micro-batch, clip, AdamW step, zero_grad, ``loss.item()``, on one fixed batch
already on the device. The trainer run is ``prodip.train.trainer.run_training`` with its data loader,
guards, per-step finiteness check, metrics.jsonl and progress bar; its per-step times are the
differences of consecutive ``elapsed_s`` / ``process_cpu_s`` stamps in metrics.jsonl (set-up,
guards before step 1 and the final checkpoint are excluded; everything done per step is
included). Rates use the median step time after ``--skip`` warm-up steps. On CPU the ratio uses
process CPU time, which other processes on a shared machine do not inflate; wall-clock rates
are printed too. Each side runs ``--repeats`` times, alternating, and the best rate is kept. The ratio trainer / bare is
printed (target >= 0.95). On CUDA, MFU = FLOPs/token (ModelConfig.flops_per_token, PaLM
appendix B) x tokens/s / peak bf16 FLOP/s (train.loop.PEAK_BF16_FLOPS) and peak memory are shown.

    python bench/train_throughput.py                                   # CPU, small model, ~1 min
    python bench/train_throughput.py --config configs/h100-0.4b.toml --shards-dir S --tokenizer-dir T

``--rope-ab`` instead times the bare loop with the cached RoPE tables (``prodip.train.model``) against
the pre-cache path (cos/sin recomputed from the positions on every forward, patched in), runs
alternating, plus the two RoPE computations alone; ``--compile`` compiles the model whatever the
config says (the first step, compile included, is reported as ``first_step_s``).

    python bench/train_throughput.py --config configs/demo.toml --rope-ab --steps 8 --skip 2 --repeats 3
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prodip.base.config import resolve  # noqa: E402
from prodip.tokenizer.shards import META_NAME, load_meta  # noqa: E402
from prodip.train.config import ModelConfig  # noqa: E402
from prodip.train.data import MixtureBatches  # noqa: E402
from prodip.train.loop import build_optimizer, causal_lm_loss, peak_flops  # noqa: E402
from prodip.train.trainer import TrainConfig, autocast_dtype, run_training  # noqa: E402

CPU_MODEL = dict(
    vocab_size=2048,
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
CPU_TRAIN = dict(batch_size=2, seq_len=128, grad_accum_steps=2, device="cpu", warmup_steps=5)


def synthetic_inputs(root: Path, vocab_size: int) -> tuple[Path, Path]:
    """A tiny tokenizer dir and random-token shards (bn, en) for a self-contained CPU run."""
    from prodip.tokenizer.bpe import tokenizer_sha256, train_tokenizer_from_texts
    from prodip.tokenizer.shards import write_meta, write_shard

    tok = train_tokenizer_from_texts(
        {"bn": ["আমার সোনার বাংলা, আমি তোমায় ভালোবাসি। " * 50], "en": ["The quick brown fox jumps over the lazy dog. " * 50]},
        vocab_size=300,
        out_dir=root / "tokenizer",
    )
    rng = np.random.default_rng(0)
    langs = {}
    for lang in ("bn", "en"):
        langs[lang] = {}
        for split, n in (("train", 400_000), ("val", 20_000)):
            rel = f"{lang}/{split}_000000.bin"
            (root / "shards" / lang).mkdir(parents=True, exist_ok=True)
            write_shard(root / "shards" / rel, rng.integers(3, vocab_size, n), "uint16")
            langs[lang][split] = [{"file": rel, "n_tokens": n}]
    write_meta(
        root / "shards",
        {
            "tokenizer_sha256": tokenizer_sha256(tok),
            "vocab_size": vocab_size,
            "token_dtype": "uint16",
            "bos_id": 1,
            "eos_id": 2,
            "pad_id": 0,
            "languages": langs,
        },
    )
    return tok, root / "shards"


def _rates(wall: list[float], cpu: list[float], tokens_per_step: int, skip: int) -> dict[str, float]:
    """Tokens/s from the median per-step wall and CPU times (stamps after ``skip`` warm-up steps)."""
    out = {}
    for name, stamps in (("wall", wall), ("cpu", cpu)):
        dt = float(np.median(np.diff(np.asarray(stamps[skip:]))))
        out[name] = tokens_per_step / dt
        out[f"step_ms_{name}"] = dt * 1e3
    return out


def bare_loop(cfg: TrainConfig, model_cfg: ModelConfig, steps: int, skip: int) -> dict[str, float]:
    """Rates of the minimal loop over one fixed batch: {"wall": tokens/s, "cpu": tokens/s}."""
    from prodip.train.model import LlamaForCausalLM

    device = torch.device("cuda" if cfg.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    amp = autocast_dtype(cfg, device)
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(model_cfg).to(device)
    opt = build_optimizer(
        model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, device=device
    )
    fwd = torch.compile(model) if cfg.compile else model
    data = MixtureBatches(cfg.shards_dir, cfg.mixture, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
    batches = [tuple(t.to(device) for t in data.next_batch()) for _ in range(cfg.grad_accum_steps)]
    n = cfg.grad_accum_steps
    wall, cpu = [], []
    t0 = time.perf_counter()
    for _ in range(steps):
        for x, y in batches:
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                loss = causal_lm_loss(fwd(x), y) / n
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # one sync per step, as any loop that logs its loss
        wall.append(time.perf_counter())
        cpu.append(time.process_time())
    del model, opt, fwd
    return {**_rates(wall, cpu, cfg.batch_size * cfg.seq_len * n, skip), "first_step_s": wall[0] - t0}


@contextmanager
def rope_recomputed():
    """The pre-cache RoPE path, patched in: cos/sin recomputed from the positions every forward."""
    import prodip.train.model as tm

    def forward(self, x, position_ids=None, offset=0):
        B, T = x.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(offset, offset + T, device=x.device).expand(B, T)
        return tm.rope_cos_sin(position_ids, self.head_dim, self.theta, x.dtype)

    saved = tm.LlamaRotaryEmbedding.forward
    tm.LlamaRotaryEmbedding.forward = forward
    try:
        yield
    finally:
        tm.LlamaRotaryEmbedding.forward = saved


def rope_alone_us(cfg: TrainConfig, model_cfg: ModelConfig, n: int = 50, repeat: int = 7) -> dict[str, float]:
    """Microseconds per forward of the RoPE cos/sin alone at the training shape (CPU), cached vs
    recomputed: the best of ``repeat`` rounds of ``n`` calls (other load on the machine only adds)."""
    import timeit

    from prodip.train.model import LlamaRotaryEmbedding

    rope = LlamaRotaryEmbedding(model_cfg)
    x = torch.empty(cfg.batch_size, cfg.seq_len, model_cfg.hidden_size)
    out = {}
    for name in ("cached", "recomputed", "cached_again"):
        with rope_recomputed() if name == "recomputed" else nullcontext():
            rope(x)  # warm-up
            out[name] = min(timeit.repeat(lambda: rope(x), number=n, repeat=repeat)) / n * 1e6
    return out


def rope_ab(cfg: TrainConfig, model_cfg: ModelConfig, args: argparse.Namespace) -> dict:
    """Bare-loop step times, cached RoPE tables vs recomputed per forward, alternating runs."""
    variants = args.rope_ab.split(",")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for r in range(args.repeats):
        for name in variants if r % 2 == 0 else variants[::-1]:
            if name == "cached":
                runs[name].append(bare_loop(cfg, model_cfg, args.steps, args.skip))
            else:
                with rope_recomputed():
                    runs[name].append(bare_loop(cfg, model_cfg, args.steps, args.skip))
        print(
            f"repeat {r}: "
            + "; ".join(
                f"{k} {v[-1]['step_ms_wall']:.1f} ms/step wall, {v[-1]['step_ms_cpu']:.1f} CPU" for k, v in runs.items()
            ),
            flush=True,
        )
    tokens = cfg.batch_size * cfg.seq_len * cfg.grad_accum_steps
    summary = {}
    for name, rs in runs.items():
        med = {k: float(np.median([x[k] for x in rs])) for k in ("step_ms_wall", "step_ms_cpu", "first_step_s")}
        summary[name] = {
            **med,
            "tokens_per_s_wall": tokens / med["step_ms_wall"] * 1e3,
            "tokens_per_s_cpu": tokens / med["step_ms_cpu"] * 1e3,
            "best_step_ms_wall": min(x["step_ms_wall"] for x in rs),
            "best_step_ms_cpu": min(x["step_ms_cpu"] for x in rs),
            "runs_first_step_s": [round(x["first_step_s"], 2) for x in rs],
            "runs_step_ms_wall": [round(x["step_ms_wall"], 2) for x in rs],
            "runs_step_ms_cpu": [round(x["step_ms_cpu"], 2) for x in rs],
        }
    if len(variants) == 2:
        summary["cached_over_recomputed_tokens_per_s"] = {
            f"{stat}{k}": summary["recomputed"][f"{stat}step_ms_{k}"] / summary["cached"][f"{stat}step_ms_{k}"]
            for stat in ("", "best_")
            for k in ("wall", "cpu")
        }
    summary["rope_alone_us_per_forward"] = rope_alone_us(cfg, model_cfg)
    summary["forwards_per_step"] = cfg.grad_accum_steps
    return summary


def trainer_run(cfg: TrainConfig, model_cfg: ModelConfig, steps: int, skip: int, out: Path) -> dict[str, float]:
    """Rates of ``run_training`` from its metrics.jsonl stamps: {"wall": tokens/s, "cpu": tokens/s}."""
    run_cfg = dataclasses.replace(
        cfg,
        out_dir=str(out),
        steps=steps,
        max_steps_this_run=0,
        resume=False,
        checkpoint_every_steps=0,
        eval_every_steps=0,
        log_every_steps=1,
    )
    run_training(run_cfg, model_cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return _rates(
        [r["elapsed_s"] for r in rows],
        [r["process_cpu_s"] for r in rows],
        cfg.batch_size * cfg.seq_len * cfg.grad_accum_steps,
        skip,
    )


def per_step_extras_us(cfg: TrainConfig, n: int = 500) -> dict[str, float]:
    """Microseconds per optimizer step of the work the trainer adds to the bare loop, timed alone:
    drawing the micro-batches from the shards, the NaN/inf check, one metrics.jsonl line."""
    import timeit

    from prodip.train.guards import check_finite
    from prodip.train.loop import lr_at

    data = MixtureBatches(cfg.shards_dir, cfg.mixture, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
    loss, norm = torch.tensor(2.5), torch.tensor(0.7)
    row = {
        "step": 1,
        "loss": 2.5,
        "grad_norm": 0.7,
        "lr": 1e-3,
        "tokens_seen": 1,
        "tokens_per_s": 1.0,
        "step_time_s": 0.1,
        "elapsed_s": 1.0,
        "process_cpu_s": 1.0,
    }
    with tempfile.TemporaryFile("w") as fh:

        def log_line():
            fh.write(json.dumps(row) + "\n")
            fh.flush()

        parts = {
            "data": lambda: [data.next_batch() for _ in range(cfg.grad_accum_steps)],
            "finite_check": lambda: check_finite(loss, norm, step=1),
            "lr_and_sync": lambda: (
                lr_at(5, lr=1.0, min_lr=0.1, warmup_steps=2, total_steps=9),
                torch.stack([loss, norm]).tolist(),
            ),
            "metrics_line": log_line,
        }
        return {k: timeit.timeit(f, number=n) / n * 1e6 for k, f in parts.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="TOML with [model] and [train] (default: a small CPU model)")
    ap.add_argument("--shards-dir"), ap.add_argument("--tokenizer-dir")
    ap.add_argument("--steps", type=int, default=25, help="optimizer steps per measurement")
    ap.add_argument("--skip", type=int, default=5, help="first steps left out (warm-up, compile)")
    ap.add_argument("--repeats", type=int, default=5, help="alternating runs of each; best kept")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.add_argument(
        "--rope-ab",
        nargs="?",
        const="cached,recomputed",
        choices=("cached,recomputed", "cached", "recomputed"),
        help="bare loop only: cached RoPE tables vs cos/sin recomputed per forward (or only one of them)",
    )
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (overrides the config)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="prodip_bench_"))
    atexit.register(shutil.rmtree, tmp, True)  # checkpoints and shards: gone at exit, also on an error
    if args.config:
        model_cfg = resolve(ModelConfig, None, toml_path=args.config, section="model")
        cfg = resolve(TrainConfig, None, toml_path=args.config, section="train")
    else:
        model_cfg, cfg = ModelConfig(**CPU_MODEL), TrainConfig(**CPU_TRAIN)
    if args.shards_dir and args.tokenizer_dir:
        tok, shards = Path(args.tokenizer_dir), Path(args.shards_dir)
    else:
        tok, shards = synthetic_inputs(tmp, model_cfg.vocab_size or CPU_MODEL["vocab_size"])
    # the vocabulary comes from the tokenizer, as in the trainer
    model_cfg = model_cfg.with_vocab_size(load_meta(shards).vocab_size, source=str(shards / META_NAME))
    cfg = dataclasses.replace(
        cfg, shards_dir=str(shards), tokenizer_dir=str(tok), progress=False, compile=cfg.compile or args.compile
    )
    device = torch.device("cuda" if cfg.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")
    if device.type == "cpu":  # the trainer sets this for CPU determinism; same setting for both
        torch.use_deterministic_algorithms(True, warn_only=True)
    if args.rope_ab:
        load_before = os.getloadavg()
        result = {
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "params": model_cfg.num_parameters(),
            "batch_size": cfg.batch_size,
            "seq_len": cfg.seq_len,
            "tokens_per_step": cfg.batch_size * cfg.seq_len * cfg.grad_accum_steps,
            "compile": cfg.compile,
            "steps": args.steps,
            "skip": args.skip,
            "repeats": args.repeats,
            **rope_ab(cfg, model_cfg, args),
        }
        result["loadavg_1_5_15_before_after"] = [list(load_before), list(os.getloadavg())]
        print(json.dumps(result, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return 0
    bare, ours = [], []
    for r in range(args.repeats):
        bare.append(bare_loop(cfg, model_cfg, args.steps, args.skip))
        ours.append(trainer_run(cfg, model_cfg, args.steps, args.skip, tmp / f"run{r}"))
        print(
            f"repeat {r}: bare {bare[-1]['wall']:,.0f} tok/s wall, {bare[-1]['cpu']:,.0f} tok/s CPU; "
            f"trainer {ours[-1]['wall']:,.0f} wall, {ours[-1]['cpu']:,.0f} CPU",
            flush=True,
        )
    clock = "cpu" if device.type == "cpu" else "wall"
    best_bare = {k: max(b[k] for b in bare) for k in ("wall", "cpu")}
    best_ours = {k: max(o[k] for o in ours) for k in ("wall", "cpu")}
    result = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "params": model_cfg.num_parameters(),
        "seq_len": cfg.seq_len,
        "tokens_per_step": cfg.batch_size * cfg.seq_len * cfg.grad_accum_steps,
        "compile": cfg.compile,
        "clock": clock,
        "bare_tokens_per_s": best_bare,
        "trainer_tokens_per_s": best_ours,
        "ratio": best_ours[clock] / best_bare[clock],
        "ratio_wall": best_ours["wall"] / best_bare["wall"],
    }
    extras = per_step_extras_us(cfg)
    bare_step_us = result["tokens_per_step"] / best_bare["wall"] * 1e6  # extras are wall-timed
    result.update(
        trainer_extras_us=extras, bare_step_us=bare_step_us, extras_fraction=sum(extras.values()) / bare_step_us
    )
    peak = peak_flops(device)
    if peak:
        fpt = model_cfg.flops_per_token(cfg.seq_len)
        result.update(
            bare_mfu=fpt * best_bare["wall"] / peak,
            trainer_mfu=fpt * best_ours["wall"] / peak,
            peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30,
        )
    print(json.dumps(result, indent=2))
    print(
        f"trainer / bare tokens/s ({clock} clock) = {result['ratio']:.3f} (target >= 0.95); the trainer's "
        f"own per-step work timed alone: {sum(extras.values()):.0f} us = {100 * result['extras_fraction']:.2f}% "
        "of a bare step"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
