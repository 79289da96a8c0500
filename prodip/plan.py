"""The resolved configuration of one ``prodip run``: one typed attribute per config table.

``prodip run`` reads each ``[table]`` of the pipeline file into the config class the stage owning
the table declares (``prodip.base.stage.Stage.tables``) and holds them here; each stage then
receives only its own config (``Stage.own``). The attributes are the config tables of a pipeline
file, in pipeline order (``prodip.base.layout.TABLES``; ``prodip.pipeline`` checks the stages
declare the same tables with the same classes).

    python -c "import dataclasses; from prodip.plan import RunPlan; print([f.name for f in dataclasses.fields(RunPlan)])"
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from prodip.conformance.config import ConformanceConfig
from prodip.export.config import ExportConfig
from prodip.serve.config import ServeConfig
from prodip.tokenizer.config import AuditConfig, DataPrepareConfig, ExtendConfig, TokenizerTrainConfig
from prodip.train.config import EvalConfig, ModelConfig, SFTConfig, TrainConfig

#: any one table's config
StageConfig = (
    TokenizerTrainConfig
    | AuditConfig
    | DataPrepareConfig
    | ModelConfig
    | TrainConfig
    | EvalConfig
    | SFTConfig
    | ExportConfig
    | ConformanceConfig
    | ServeConfig
)


@dataclass(frozen=True)
class RunPlan:
    """Every stage's config of one run (run defaults < the pipeline file's table), by config table."""

    tokenizer: TokenizerTrainConfig
    audit: AuditConfig
    extend: ExtendConfig
    data: DataPrepareConfig
    model: ModelConfig
    train: TrainConfig
    eval: EvalConfig
    sft: SFTConfig
    export: ExportConfig
    conformance: ConformanceConfig
    serve: ServeConfig

    @classmethod
    def classes(cls) -> dict[str, type[Any]]:
        """Config table -> its config class, in pipeline order."""
        hints = typing.get_type_hints(cls)
        return {f.name: hints[f.name] for f in dataclasses.fields(cls)}

    def configs(self) -> dict[str, StageConfig]:
        """Config table -> its config, in pipeline order (for the resolved ``config.toml``)."""
        configs: dict[str, StageConfig] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return configs

    def table(self, name: str) -> StageConfig | None:
        """The config of table ``name`` (``None``: no such table, e.g. in a changed key of an older config)."""
        return self.configs().get(name)

    def to_dict(self) -> dict[str, dict[str, object]]:
        """Config table -> its config as a plain dict (``dataclasses.asdict``)."""
        return {name: dataclasses.asdict(cfg) for name, cfg in self.configs().items()}
