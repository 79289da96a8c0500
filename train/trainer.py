"""``prodip train``: TrainConfig and :func:`train`, the training run from shards to checkpoints.

Order of a run: distributed set-up -> tokenizer gate + shard/tokenizer hash check -> model,
AdamW -> resume (weights, Adam moments, RNG, data position) -> optional activation
checkpointing / torch.compile -> gradient-flow arbiter (and update-flow probe on a fresh run)
-> steps with per-step metrics (``metrics.jsonl`` and TensorBoard event files) -> checkpoints
(``loss.png`` redrawn at each, at each held-out evaluation and on Ctrl-C, see ``train/observe.py``).
A NaN/inf loss or gradient stops the run before the weights are touched; the last good checkpoint
stays as it was. ``--init-from`` starts from another run's or a Hugging Face Llama model's weights
with a fresh optimizer and schedule (``train/init.py``).

    python -m prodip.train train --config configs/demo.toml
    torchrun --nproc_per_node 2 -m prodip.train train --config configs/demo.toml --device cpu
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import signal
import threading
import time
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, TypedDict

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from prodip.base.config import coerce, dump_toml, read_toml, write_text_atomic
from prodip.base.errors import ConfigError, InvalidInput, MissingInput, OutputExists
from prodip.base.files import raise_for_room
from prodip.base.jsontypes import JSONObject
from prodip.tokenizer.audit import check_gate
from prodip.tokenizer.shards import ShardsMeta, load_meta, meta_sha256
from prodip.train import attention, checkpoint, determinism, distributed, freeze, fsdp, guards, init
from prodip.train.config import ModelConfig, TrainConfig
from prodip.train.data import MixtureBatches, val_batches
from prodip.train.loop import (
    batch_loss,
    build_optimizer,
    enable_activation_checkpointing,
    evaluate,
    peak_flops,
    train_step,
)
from prodip.train.model import LlamaForCausalLM
from prodip.train.observe import RunObserver, interrupt_message, plot_loss  # noqa: F401 (plot_loss re-exported)
from prodip.train.records import SFT_EVAL_FILE
from prodip.train.saver import AsyncCheckpointer
from prodip.train.schedule import lr_for

log = logging.getLogger("prodip.train")


def compile_model(model: torch.nn.Module, *, mode: str, scope: str) -> torch.nn.Module:
    """``torch.compile`` the model (``scope = model``: returns the compiled wrapper) or each decoder
    layer in place (``scope = layers``: ``nn.Module.compile``, returns the model itself). Either way
    ``state_dict`` keys stay the model's (no ``_orig_mod.`` prefix reaches a checkpoint: the
    trainer saves ``model``, not the wrapper)."""
    kwargs = {} if mode == "default" else {"mode": mode}
    if scope == "layers":
        for layer in model.model.layers:
            layer.compile(**kwargs)
        return model
    return torch.compile(model, **kwargs)


#: TrainConfig fields that set the learning rate of a step.
_LR_FIELDS = ("steps", "lr", "min_lr", "warmup_steps", "lr_schedule", "decay_fraction")

#: TrainConfig fields that shape the optimisation trajectory: a resume that changes one of them
#: continues, but is no longer the run an uninterrupted job would have produced.
TRAJECTORY_FIELDS = (
    "steps",
    "batch_size",
    "seq_len",
    "grad_accum_steps",
    "lr",
    "min_lr",
    "warmup_steps",
    "lr_schedule",
    "decay_fraction",
    "weight_decay",
    "beta1",
    "beta2",
    "adam_eps",
    "grad_clip",
    "mixture",
    "seed",
    "data_order",
    "dtype",
    "new_embeddings_first_steps",
)


def resume_differences(saved: Mapping[str, object], cfg: TrainConfig) -> list[str]:
    """``"lr 0.003 -> 0.001"`` for each trajectory field that differs from the checkpoint's config."""
    return [
        f"{name} {saved[name]!r} -> {getattr(cfg, name)!r}"
        for name in TRAJECTORY_FIELDS
        if name in saved and saved[name] != getattr(cfg, name)
    ]


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> Optional[torch.dtype]:
    """bf16 autocast on CUDA (auto/bfloat16), none (fp32) otherwise; weights stay fp32."""
    if cfg.dtype == "float32" or (cfg.dtype == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


def _check_inputs(cfg: TrainConfig, model_cfg: ModelConfig) -> tuple[str, ShardsMeta]:
    """Tokenizer gate, shard/tokenizer hash and vocab checks. Returns (tokenizer sha256, meta)."""

    tok_json = Path(cfg.tokenizer_dir) / "tokenizer.json"
    if not tok_json.is_file():
        raise MissingInput(f"{tok_json}: not found (TrainConfig.tokenizer_dir; made by `prodip tokenizer train`)")
    tok_sha = checkpoint.file_sha256(tok_json)
    _check_gate(cfg)
    meta = load_meta(cfg.shards_dir, expected_tokenizer_sha256=tok_sha)
    if cfg.seq_len > model_cfg.max_position_embeddings:
        raise InvalidInput(
            f"TrainConfig.seq_len {cfg.seq_len} exceeds [model] max_position_embeddings "
            f"{model_cfg.max_position_embeddings}"
        )
    return tok_sha, meta


def _check_gate(cfg: TrainConfig) -> None:
    """Refuse a tokenizer whose fertility audit failed, unless ``force`` (tokenizer.audit owns the gate).

    Raises:
        ValueError: the audit failed (and not ``force``), or its fertility.json is stale.
    """

    check_gate(cfg.tokenizer_dir, force=cfg.force)


def _build(cfg: TrainConfig, model_cfg: ModelConfig, device: torch.device, fsdp_shard: bool = False):
    """The model (FSDP2-sharded when ``fsdp_shard``) and its AdamW, built over the final parameters."""
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(model_cfg).to(device)
    model.loss_chunk_tokens = cfg.loss_chunk_tokens
    model.fuse_projections(cfg.fused_projections)
    if fsdp_shard:
        fsdp.shard_model(model, device)
    optimizer = build_optimizer(
        model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, device=device
    )
    return model, optimizer


class _HoldGrads(torch.optim.SGD):
    """An optimizer for the accumulation guard: ``train_step`` runs as in training, and the gradients it
    accumulated stay in ``.grad`` (no step, no zeroing) for the guard to read."""

    def __init__(self, params) -> None:
        super().__init__(params, lr=0.0)

    def step(self, closure=None):  # noqa: ARG002 (the optimizer interface)
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002
        return None


@contextlib.contextmanager
def _exact_fp32():
    """fp32 matmuls without TF32, for a comparison to 1e-4: bf16 autocast and TF32 round differently for a
    batch and its micro-batches. Attention may use any SDPA kernel that computes in fp32 (CUDA: the
    memory-efficient one, which keeps no (T x T) matrix; CPU: its flash kernel), whatever backend the run
    chose for bf16 (flash and cuDNN on CUDA take half precision only)."""
    precision, cudnn_tf32 = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    fp32_kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    try:
        with sdpa_kernel(fp32_kernels):
            yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32


def check_accumulation(model, batches, device) -> guards.AccumulationReport:
    """:func:`guards.check_accumulation` on the run's own micro-batches: ``train_step`` over k of them
    (their first row each; k = min(N, 4)) against ``train_step`` over those k rows as one batch.

    Packed chat rows hold unequal numbers of trained targets, so a step that weighed micro-batches
    instead of trained tokens fails here. One row per micro-batch keeps the one-batch side no bigger
    than a micro-batch of k rows. Both run in exact fp32 (no autocast, no TF32: :func:`_exact_fp32`), so
    the tolerance is a relative L2 difference of 1e-5 on CPU and 1e-4 on CUDA, where matmul kernels
    still sum in a shape-dependent order; a wrong weighting differs by 1e-2 or more.

    Args:
        model: the eager model (not compiled: the batch shapes differ from training's), fp32 weights.
        batches: the step's N >= 2 micro-batches, as the loader gives them.
    Raises:
        GuardError: the accumulated gradient differs from the one-batch gradient.
    """
    rows = [tuple(t[:1] for t in b) for b in batches[: min(len(batches), 4)]]
    one = tuple(torch.cat(parts) for parts in zip(*rows))

    def run(micro):
        def fn(m):
            train_step(
                m, _HoldGrads(m.parameters()), micro, lr=0.0, grad_clip=0.0, device=device,
                autocast_dtype=None, check_finite=False,
            )  # fmt: skip

        return fn

    with _exact_fp32():
        return guards.check_accumulation(
            model, run([one]), run(rows), max_rel_diff=1e-5 if device.type == "cpu" else 1e-4
        )


def _run_guards(cfg: TrainConfig, model, optimizer, batches, device, amp, fresh: bool, eager=None) -> None:
    """Gradient-flow arbiter (every run, after compile), the accumulation check (when a step has
    several micro-batches; on ``eager``, the uncompiled model) and update-flow probe (fresh runs)."""

    batch = tuple(t.to(device) for t in batches[0])

    def loss_fn(m):
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            return batch_loss(m, batch)

    guards.check_gradient_flow(model, loss_fn)  # raises GuardError naming each parameter at fault
    log.info("gradient-flow arbiter: every trainable parameter got a finite, nonzero gradient")
    if len(batches) > 1 and eager is not None:
        report = check_accumulation(eager, batches, device)
        log.info(
            "accumulation guard: %d accumulated micro-batches give the one-batch gradient (relative difference "
            "%.2g), weighed by their trained tokens",
            min(len(batches), 4),
            report.rel_diff,
        )
    if fresh:

        def step_fn(m, opt):
            train_step(m, opt, batches, lr=cfg.lr, grad_clip=cfg.grad_clip, device=device, autocast_dtype=amp)

        guards.check_update_flow(model, optimizer, step_fn, restore=True)
        log.info("update-flow probe: every parameter moved and stayed finite")


class StopRequest:
    """SIGINT (Ctrl-C) and SIGTERM during the step loop: finish the step, checkpoint it, then stop.

    A signal only sets a flag (the step in progress may be inside ``optimizer.step``, updating the weights
    and AdamW moments in place, so nothing is saved from the middle of it); the loop reads the flag after
    each step (:meth:`requested`, every rank agreeing: DDP saves are collective), saves that step and
    raises ``KeyboardInterrupt`` (exit 130, ``prodip ...: interrupted``). A second signal, a second or
    more after the first, stops at once, keeping only the checkpoints already written. Installed on the
    main thread only (Python delivers signals there), for signals not ignored (a job started with
    ``nohup`` or ``&`` keeps ignoring them).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    #: seconds after the first signal within which another is taken as its copy, not as a second one
    REPEAT_S = 1.0

    def __init__(self, announce: bool = True) -> None:
        self.signum: Optional[int] = None
        self._first_t = 0.0
        self.announce = announce
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old.clear()

    def _handle(self, signum: int, _frame: Any) -> None:
        now = time.monotonic()
        if self.signum is not None:
            # a copy of the first (a terminal's Ctrl-C reaches torchrun and every rank, and torchrun then
            # forwards it) is ignored; a signal sent later is the user's second: stop now
            if now - self._first_t >= self.REPEAT_S:
                raise KeyboardInterrupt
            return
        self.signum, self._first_t = signum, now
        if self.announce:
            log.warning(
                "%s: finishing this step, then saving a checkpoint of it and stopping (send it again to stop at "
                "once, keeping only the checkpoints already written)",
                signal.Signals(signum).name,
            )

    def requested(self, device: torch.device) -> bool:
        """Whether any rank was signalled (one tiny all-reduce per step under torchrun)."""
        return distributed.any_flag(self.signum is not None, device)


#: the tables of the config.toml a run dir holds: ``prodip train`` writes [model] + [train], ``prodip sft`` [model] + [sft]
RUN_CONFIG_TABLES = ({"model", "train"}, {"model", "sft"})


def refuse_foreign_run_dir(run_dir: Path) -> None:
    """Refuse an ``out_dir`` that is not empty and that no ``prodip train``/``sft`` made, before anything is
    written: a run writes config.toml, metrics.jsonl, loss.png there, and would replace a file of those
    names that is the user's (as ``prodip tokenizer train``, ``data prepare`` and ``export`` refuse theirs).

    A run dir is one with ``checkpoints/`` or a ``config.toml`` of exactly :data:`RUN_CONFIG_TABLES`'s
    tables (a run stopped before its first checkpoint has it), or only the ``tokenizer/`` that ``prodip sft``
    writes first; a missing or empty folder is fine.

    Raises:
        FileExistsError: ``run_dir`` holds anything else (naming it and the fix).
    """
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return
    if (run_dir / checkpoint.CHECKPOINTS_DIRNAME).is_dir():
        return
    names = {p.name for p in run_dir.iterdir()}
    if (
        "tokenizer" in names
        and names <= {"tokenizer", SFT_EVAL_FILE}
        and (run_dir / "tokenizer" / "tokenizer.json").is_file()
    ):
        # an sft run stopped after writing its chat tokenizer (and its "before" score, sft_eval.json), before its
        # config.toml: e.g. its conversations were refused, or it was interrupted there
        return
    try:
        tables = set(read_toml(run_dir / "config.toml"))
    except (ConfigError, OSError):
        tables = set()
    if tables in RUN_CONFIG_TABLES:
        return
    raise OutputExists(
        f"{run_dir}: is not empty and is not a training run dir (no checkpoints/, no config.toml written by "
        "`prodip train`), and a run would replace its config.toml, metrics.jsonl and loss.png; choose another "
        "--out-dir, or empty that folder yourself"
    )


def _write_run_config(run_dir: Path, cfg: TrainConfig, model_cfg: ModelConfig) -> None:
    text = dump_toml({"model": model_cfg.to_dict(), "train": dataclasses.asdict(cfg)})
    write_text_atomic(run_dir / "config.toml", text)


def train(cfg: TrainConfig, model_cfg: ModelConfig) -> Path:
    """Train (or resume) a run; see the module docstring for the order of events.

    Args:
        cfg: the run's TrainConfig.
        model_cfg: the [model] table as ModelConfig.
    Returns:
        The run dir (``cfg.out_dir``) holding config.toml, metrics.jsonl, loss.png, checkpoints/.
    Raises:
        FileNotFoundError: tokenizer dir / shards / resume checkpoint missing.
        ValueError: shards from another tokenizer, a failed tokenizer gate (without ``force``),
            vocab/seq_len mismatch, a resume checkpoint from another model config.
        train.guards.GuardError: a parameter gets no gradient / no update before step 1.
        train.guards.NonFiniteError: NaN/inf loss or gradient at some step.
    """
    return run_training(cfg, model_cfg)["run_dir"]


class RunResult(TypedDict):
    """What a training (or fine-tuning) invocation returns, for tests and benches."""

    run_dir: Path
    #: the trained model (unwrapped: no DDP, compile or gradient hooks)
    model: torch.nn.Module
    step: int
    #: the last step's metrics row (``metrics.jsonl``'s keys)
    last: dict[str, float]


def run_training(cfg: TrainConfig, model_cfg: ModelConfig) -> RunResult:
    """:func:`train`, returning {"run_dir", "model", "step", "last"} (for tests and benches)."""
    info = distributed.setup(cfg.device, group=cfg.parallel != "auto")
    clean = False
    try:
        run = _Run(cfg, model_cfg, info)
        result = run.execute()
        del run  # drop the DDP wrapper (its reducer holds process-group work) before the group goes
        clean = True
        return result
    finally:
        distributed.teardown(clean=clean)


class _Run:
    """State of one invocation; :meth:`execute` is the whole run."""

    def __init__(self, cfg: TrainConfig, model_cfg: ModelConfig, info: distributed.DistInfo) -> None:
        self.cfg, self.model_cfg, self.info = cfg, model_cfg, info
        self.run_dir = Path(cfg.out_dir)
        self.ckpt_dir = self.run_dir / checkpoint.CHECKPOINTS_DIRNAME
        self.device = info.device
        self.amp = autocast_dtype(cfg, self.device)
        self.step, self.tokens_seen = 0, 0
        self.sources: list[dict[str, Any]] = []  # the shards' source records (_prepare), for the model card
        self.no_val: list[str] = []

    def execute(self) -> RunResult:
        cfg, info = self.cfg, self.info
        refuse_foreign_run_dir(self.run_dir)  # before _prepare: sft writes its tokenizer/ into the run dir
        self._prepare()
        if not cfg.resume and (self.ckpt_dir / checkpoint.LATEST_FILE).exists():
            raise OutputExists(
                f"{self.ckpt_dir} already holds checkpoints; pass --resume to continue "
                "that run, or choose another --out-dir"
            )
        checkpoint.refuse_newer_checkpoints(self.ckpt_dir)  # saving replaces and prunes step dirs
        determinism.configure(cfg.deterministic, self.device)
        self.attn = self._attention_kernel()
        self.fsdp = cfg.parallel == "fsdp" and info.grouped
        model, self.optimizer = _build(cfg, self.model_cfg, self.device, self.fsdp)
        self.model = model
        if self.init is not None and not cfg.resume:
            init.apply_init(model, self.init)
            log.info("initialised from %s; fresh optimizer and lr schedule", self.init.source)
        self.freeze = None
        if cfg.new_embeddings_first_steps:
            if self.fsdp:
                raise InvalidInput("TrainConfig.new_embeddings_first_steps: not with parallel = fsdp (sharded rows)")
            first = freeze.read_first_new_id(cfg.init_from)
            self.freeze = freeze.NewRowsOnly(model, self.optimizer, first)  # not yet wrapped (DDP, compile)
        self.data = self._make_data()
        if cfg.resume:
            self._resume()
        if info.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._write_config()
            self._trim_metrics()
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(model)
        self.fwd = compile_model(model, mode=cfg.compile_mode, scope=cfg.compile_scope) if cfg.compile else model
        if info.grouped and not self.fsdp:
            # broadcast_buffers=False: the only buffers are the RoPE tables, identical on every rank;
            # gradient_as_bucket_view: each .grad is a view into its all-reduce bucket (no second copy)
            self.fwd = DDP(
                self.fwd,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                broadcast_buffers=False,
                gradient_as_bucket_view=True,
            )
        if info.grouped and info.is_main:
            log.info("parallel: %s over %d rank(s)", "fsdp" if self.fsdp else "ddp", info.world_size)
        self.saver = None
        if not self.fsdp:
            self.saver = AsyncCheckpointer(
                self.ckpt_dir, rank=info.rank, world_size=info.world_size, background=cfg.async_checkpoint
            )
        try:
            # the SDPA choice holds while the compiled graph is traced (first call) and every call after
            with attention.context(self.attn.backend):
                if cfg.guards:
                    saved = self.data.state_dict()
                    probe = [self.data.next_batch() for _ in range(cfg.grad_accum_steps)]
                    self.data.load_state_dict(saved)  # the probe does not consume the stream
                    _run_guards(
                        cfg, self.fwd, self.optimizer, probe, self.device, self.amp, fresh=self.step == 0,
                        eager=None if self.fsdp else model,
                    )  # fmt: skip
                if self.device.type == "cuda":  # the probes' model/optimizer snapshots are not training's peak
                    torch.cuda.reset_peak_memory_stats(self.device)
                last = self._loop()
        except KeyboardInterrupt:
            if self.saver is not None:
                if self.saver.busy and info.is_main:  # say what the exit waits for
                    log.warning("waiting for the checkpoint in flight to be written to %s", self.ckpt_dir)
                self.saver.close()  # the save in flight completes first: it may be the one to resume from
                self.saver = None
            if info.is_main:
                log.warning("%s", interrupt_message(self.ckpt_dir, self._kept_checkpoint()))
            raise
        finally:
            if self.freeze is not None:  # the returned model carries no gradient hooks
                self.freeze.remove()
            if self.saver is not None:  # the save in flight completes, also after an error (a good state)
                self.saver.close()
        self.fwd = None  # the compiled / DDP wrappers die here, while the process group is alive
        return {"run_dir": self.run_dir, "model": model, "step": self.step, "last": last}

    def _attention_kernel(self) -> attention.AttentionKernel:
        """Probe ``[train] attention_backend`` (under ``deterministic``, the deterministic choice) on
        this device with the model's attention shapes; log the kernel that ran once.

        Raises:
            InvalidInput: the backend cannot run here (one line naming the option and the reason).
        """
        m, cfg = self.model_cfg, self.cfg
        gqa = m.num_key_value_heads < m.num_attention_heads
        choices = determinism.attention_choice(cfg.attention_backend, cfg.deterministic, self.device, gqa=gqa)
        shapes = dict(heads=m.num_attention_heads, kv_heads=m.num_key_value_heads, head_dim=m.head_dim)
        dtype = self.amp or torch.float32
        for i, backend in enumerate(choices):
            try:
                kernel = attention.probe(backend, self.device, dtype, seq_len=cfg.seq_len, **shapes)
                break
            except InvalidInput:
                if i == len(choices) - 1:
                    raise
        if self.info.is_main:
            log.info("%s", kernel.describe())
        return kernel

    # ---- what a fine-tuning run (prodip.train.sft) replaces: its inputs, data and run config

    def _prepare(self) -> None:
        """Check the inputs; set ``tok_sha``, ``init`` (``--init-from``) and the final ``model_cfg``."""
        self.tok_sha, meta = _check_inputs(self.cfg, self.model_cfg)
        self.shards_meta_sha256 = meta_sha256(self.cfg.shards_dir)  # recorded in each checkpoint (train_done)
        self.sources = meta.sources  # the shards' source records, for the model card
        self.init = self._init_source() if self.cfg.init_from else None
        # the one place the model's vocabulary meets the tokenizer's (shards are tied to the tokenizer by sha256)
        self.model_cfg = self.model_cfg.with_vocab_size(meta.vocab_size, source=f"{self.cfg.shards_dir}/meta.json")

    def _make_data(self):
        """The training batches: ``next_batch()``, ``state_dict()``, ``load_state_dict()``, ``langs``."""
        cfg = self.cfg
        return MixtureBatches(
            cfg.shards_dir,
            cfg.mixture,
            cfg.batch_size,
            cfg.seq_len,
            seed=cfg.seed,
            rank=self.info.rank,
            world_size=self.info.world_size,
            expected_tokenizer_sha256=self.tok_sha,
            order=cfg.data_order,
            pin_memory=self.device.type == "cuda",
        )

    def _write_config(self) -> None:
        _write_run_config(self.run_dir, self.cfg, self.model_cfg)

    def _init_source(self) -> init.InitWeights:
        """Weights and model config of ``--init-from``; its architecture replaces the [model] table's."""
        source = init.load_init(self.cfg.init_from, tokenizer_sha256=self.tok_sha)
        changed = init.architecture_differences(self.model_cfg, source.config)
        if changed:
            log.warning("--init-from: the model config is %s's (%s)", source.source, "; ".join(changed))
        self.model_cfg = source.config
        if self.cfg.seq_len > self.model_cfg.max_position_embeddings:
            raise InvalidInput(
                f"TrainConfig.seq_len {self.cfg.seq_len} exceeds max_position_embeddings "
                f"{self.model_cfg.max_position_embeddings} of --init-from {source.source}"
            )
        return source

    def _kept_checkpoint(self) -> Optional[Path]:
        try:
            return checkpoint.resolve_checkpoint(self.ckpt_dir)
        except (FileNotFoundError, ValueError):
            return None

    def _lr(self, step: int, cfg: Optional[TrainConfig] = None) -> float:
        cfg = cfg or self.cfg
        return lr_for(
            step,
            schedule=cfg.lr_schedule,
            lr=cfg.lr,
            min_lr=cfg.min_lr,
            warmup_steps=cfg.warmup_steps,
            total_steps=cfg.steps,
            decay_fraction=cfg.decay_fraction,
        )

    def _check_lr_continuity(self, saved: Mapping[str, object], step: int) -> None:
        """A resume that changes the schedule's shape (e.g. more ``steps``) must not make the lr jump.

        An explicit change of ``lr`` or ``min_lr`` (a lower lr after a spike) is the user's intent
        and only warned about (:func:`resume_differences`).

        Raises:
            ValueError: the next step's lr under the new settings differs from the saved run's,
                naming both values and the ways to train longer.
        """
        if any(k in saved and saved[k] != getattr(self.cfg, k) for k in ("lr", "min_lr")):
            return
        hints = typing.get_type_hints(TrainConfig)  # the saved values are the checkpoint's JSON: checked
        changes = {k: coerce(saved[k], hints[k], f"checkpoint train_config {k}") for k in _LR_FIELDS if k in saved}
        before = dataclasses.replace(self.cfg, **changes)
        old, new = self._lr(step, before), self._lr(step)
        if step > 0 and abs(new - old) > 1e-9 * abs(old):
            raise InvalidInput(
                f"resuming at step {step} with these settings makes the learning rate jump from {old:.3g} to "
                f"{new:.3g}. To train longer than planned: use --lr-schedule wsd from the start and raise --steps "
                "before its decay begins, or start a new schedule from this run's weights with "
                f"`--init-from {self.run_dir} --out-dir NEW_DIR` (fresh optimizer and warmup)"
            )

    def _resume(self) -> None:
        if self.fsdp:
            resumed = fsdp.load_training_state(self.ckpt_dir, self.model, self.optimizer)
        else:
            resumed = checkpoint.load_training_state(self.ckpt_dir, self.model, self.optimizer)
        state, where = resumed.state, resumed.checkpoint_dir
        if state.tokenizer_sha256 != self.tok_sha:
            raise InvalidInput(
                f"{where}: trained with tokenizer sha256 "
                f"{state.tokenizer_sha256[:12]}, this run's tokenizer is {self.tok_sha[:12]}"
            )
        if (state.world_size or 1) * state.train_config.get(
            "batch_size", 0
        ) != self.info.world_size * self.cfg.batch_size:
            log.warning(
                "global batch differs from the checkpoint's; the token stream continues but "
                "the run is no longer bitwise comparable"
            )
        changed = resume_differences(state.train_config, self.cfg)
        if changed:  # legitimate (e.g. a lower lr after a spike), but never silent
            log.warning(
                "resuming with changed training settings (%s); the run is no longer bitwise "
                "comparable to an uninterrupted one",
                "; ".join(changed),
            )
        self._check_lr_continuity(state.train_config, state.step)
        self.step, self.tokens_seen = state.step, state.tokens_seen
        if state.data_state is None:
            raise InvalidInput(f"{where / checkpoint.TRAINER_STATE_FILE}: no data_state; cannot resume the data stream")
        self.data.load_state_dict(state.data_state)
        log.info("resumed from %s at step %d", where, self.step)

    def _trim_metrics(self) -> None:
        """Drop metrics lines past the resume step (written by a killed run after its last save)."""
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return
        keep = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line)["step"] <= self.step:
                    keep.append(line)
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut short by a kill
        write_text_atomic(path, "".join(line + "\n" for line in keep))

    def _loop(self) -> dict[str, float]:
        cfg, info = self.cfg, self.info

        end = cfg.steps if cfg.max_steps_this_run <= 0 else min(cfg.steps, self.step + cfg.max_steps_this_run)
        start_step = self.step  # the host buffers of a save are allocated after this run's first step
        tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum_steps * info.world_size
        flops_per_token = self.model_cfg.flops_per_token(cfg.seq_len)
        peak = peak_flops(self.device)
        # FSDP2: every rank takes part in each forward (the all-gathers), so every rank evaluates
        val = self._val_sets() if cfg.eval_every_steps and (info.is_main or self.fsdp) else {}
        bar = tqdm(
            total=cfg.steps,
            initial=self.step,
            unit="step",
            dynamic_ncols=True,
            disable=not (cfg.progress and info.is_main),
        )
        metrics = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") if info.is_main else None
        observer = RunObserver(self.run_dir, self.step, self.no_val) if info.is_main else None
        last: dict[str, float] = {}
        loop_start, cpu_start = time.perf_counter(), time.process_time()
        self.loop_start_unix_s = time.time()  # wall clock: comparable with the launcher's (time to first step)
        self.last_save_t = loop_start
        n = cfg.grad_accum_steps
        attention_written = False
        stop = StopRequest(announce=info.is_main)
        try:
            stop.__enter__()
            while self.step < end:
                t0 = time.perf_counter()
                lr = self._lr(self.step)
                if self.freeze is not None:  # only the extension's new rows train for the first steps
                    if self.step < cfg.new_embeddings_first_steps:
                        self.freeze.install()
                    else:
                        self.freeze.remove()
                micro = (self.data.next_batch() for _ in range(n))  # drawn one ahead inside train_step
                out = train_step(
                    self.fwd,
                    self.optimizer,
                    micro,
                    lr=lr,
                    grad_clip=cfg.grad_clip,
                    device=self.device,
                    autocast_dtype=self.amp,
                    step=self.step + 1,
                    num_micro_batches=n,
                )
                dt = time.perf_counter() - t0
                self.step += 1
                self.tokens_seen += tokens_per_step
                last = {
                    "step": self.step,
                    **out,
                    "tokens_seen": self.tokens_seen,
                    "tokens_per_s": tokens_per_step / dt,
                    "step_time_s": dt,
                }
                if peak:  # MFU = achieved FLOP/s / peak (PaLM appendix B); per-rank peak x ranks
                    last["mfu"] = flops_per_token * last["tokens_per_s"] / (peak * info.world_size)
                log_now = self.step % cfg.log_every_steps == 0 or self.step == end
                if self.device.type == "cuda" and log_now:
                    gib = torch.cuda.max_memory_allocated(self.device) / 2**30
                    by_rank = distributed.all_gather_floats(gib, self.device)
                    last["peak_memory_gib"] = max(by_rank)  # the fullest rank's; each rank's below
                    if info.world_size > 1:
                        last["peak_memory_gib_by_rank"] = by_rank
                if val and self.step % cfg.eval_every_steps == 0:
                    last["val_loss"] = {
                        lang: evaluate(self.model, b, device=self.device, autocast_dtype=self.amp)
                        for lang, b in val.items()
                    }
                if self.saver is not None and self.step == start_step + 1:  # AdamW state exists now
                    self.saver.prepare(
                        model=self.model,
                        tie_word_embeddings=self.model_cfg.tie_word_embeddings,
                        optimizer=self.optimizer,
                    )
                held = self.saver.pop_held_s() if self.saver is not None else 0.0  # a CPU snapshot's copy
                if held:
                    last["checkpoint_stall_s"] = held
                stopping = stop.requested(self.device)
                saved = self._save_due(end) or stopping  # a signal: this step is the one to resume from
                if saved:
                    last["checkpoint_stall_s"] = last.get("checkpoint_stall_s", 0.0) + self._save()
                last["elapsed_s"] = time.perf_counter() - loop_start
                last["process_cpu_s"] = time.process_time() - cpu_start
                if metrics and log_now:
                    if not attention_written:  # the first line this invocation writes names the kernel
                        last.update(self._attention_fields())
                        attention_written = True
                    metrics.write(json.dumps(last) + "\n")
                    metrics.flush()
                    observer.log(last)
                bar.update(1)
                bar.set_postfix(
                    loss=f"{out['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{last['tokens_per_s']:.0f}", refresh=False
                )
                if observer and (saved or "val_loss" in last):
                    observer.refresh()
                if stopping and self.step < end:  # on the last step the run is complete: it ends as usual
                    if info.is_main:
                        log.warning("saved step %d on %s; stopping", self.step, signal.Signals(stop.signum or 2).name)
                    raise KeyboardInterrupt
        except Exception as err:
            raise_for_room(err, self.run_dir)  # metrics.jsonl, TensorBoard events, loss.png: named
            raise
        finally:
            stop.__exit__()
            bar.close()
            if metrics:
                metrics.close()
            if observer:
                observer.close()  # also on Ctrl-C: loss.png shows every step that was logged
        return last

    def _attention_fields(self) -> dict[str, Any]:
        """The first metrics line of each invocation names the attention setting and the kernel that ran,
        and when (Unix seconds) its training loop started: a launcher subtracts its own start time
        to get the time to the first step (imports, data, model, compile, guards)."""
        return {
            "attention_backend": self.attn.backend,
            "attention_kernel": self.attn.kernel,
            "deterministic": self.cfg.deterministic,
            "loop_start_unix_s": round(self.loop_start_unix_s, 3),
        }

    def _save_due(self, end: int) -> bool:
        """Save at this step? The last step, every ``checkpoint_every_steps``, or ``checkpoint_every_s``
        after the previous save by rank 0's clock (broadcast, so every rank agrees)."""
        every = self.cfg.checkpoint_every_steps
        if self.step == end or (every and self.step % every == 0):
            return True
        if not self.cfg.checkpoint_every_s:
            return False
        due = time.perf_counter() - self.last_save_t >= self.cfg.checkpoint_every_s
        return distributed.broadcast_flag(due, self.device)

    def _val_sets(self) -> dict[str, list]:
        """Validation batches per language; a language without validation tokens is left out, with a warning."""
        sets = {
            lang: val_batches(self.cfg.shards_dir, lang, self.cfg.seq_len, self.cfg.batch_size, self.cfg.eval_tokens)
            for lang in self.data.langs
        }
        self.no_val = [lang for lang, b in sets.items() if not b]
        for lang in self.no_val:
            log.warning(
                "language %r has fewer than seq_len + 1 = %d validation tokens in %s: its held-out loss is not "
                "measured (absent from metrics.jsonl and loss.png; prepare the data with a larger val_fraction)",
                lang,
                self.cfg.seq_len + 1,
                self.cfg.shards_dir,
            )
        return {lang: b for lang, b in sets.items() if b}

    def _data_card(self) -> JSONObject:
        """What the checkpoint records for the export's card: the shards' source records, the tokens the
        data loader served per language (``positions``: global, all ranks) and per source, and
        ``--init-from``'s base model. Per source is the language's count times the source's share of the
        language's tokens in the shards: exact in expectation, since windows are drawn across the whole
        stream of a language (``data_order = "shuffle"``)."""
        positions = getattr(self.data, "positions", {})  # MixtureBatches' counters (other loaders: none)
        seen = {lang: int(n) for lang, n in positions.items()}
        by_source = {  # sources of an earlier stage (a fine-tuning run's base) keep their own "tokens_seen"
            s["name"]: int(round(seen[s["language"]] * s.get("tokens_share_of_language", 0.0)))
            for s in self.sources
            if s["language"] in seen and "tokens_share_of_language" in s
        }
        return {
            "sources": [*self.sources],
            "tokens_seen_by_language": {lang: n for lang, n in seen.items()},
            "tokens_seen_by_source": {name: n for name, n in by_source.items()},
            "tokens_seen_by_source_method": "language counter x the source's share of the language's shard tokens",
            "init_from": {"source": self.init.source, "kind": self.init.kind} if self.init else None,
        }

    def _save(self) -> float:
        """Save this step (every rank calls it); returns the seconds training was held.

        DDP / one process: the state is copied to host memory and written in the background
        (``prodip.train.saver``). FSDP2: a blocking save through ``prodip.train.fsdp``.
        """
        kwargs: checkpoint.SaveArgs = {
            "step": self.step,
            "model_config": self.model_cfg,
            "tokenizer_dir": self.cfg.tokenizer_dir,
            "tokens_seen": self.tokens_seen,
            "train_config": dataclasses.asdict(self.cfg),
            "data_state": {**self.data.state_dict(), "shards_meta_sha256": self.shards_meta_sha256},
            "keep_last": self.cfg.keep_last,
            "extra_state": {"data_card": self._data_card()},
        }
        if self.fsdp:
            stall = fsdp.save_checkpoint(
                self.ckpt_dir,
                model=self.model,
                optimizer=self.optimizer,
                rank=self.info.rank,
                world_size=self.info.world_size,
                **kwargs,
            )
        else:
            stall = self.saver.save(model=self.model, optimizer=self.optimizer, **kwargs)
        self.last_save_t = time.perf_counter()
        return stall
