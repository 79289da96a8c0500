"""transformers (the independent implementation conformance already depends on): its chat template and stop ids.

python -c "from prodip.conformance.runtimes.transformers import TransformersAdapter; help(TransformersAdapter.chat)"
"""

from __future__ import annotations

from typing import Optional

from prodip.conformance.runtimes.common import ChatJob, ChatOutput, RuntimeAdapter

NAME = "transformers"


class TransformersAdapter(RuntimeAdapter):
    name = NAME

    def available(self) -> Optional[str]:
        return None  # a dependency of conformance: never skipped (an import failure fails its check)

    def chat_applies(self, job: ChatJob) -> bool:
        return True  # it reads the export's own tokenizer files, which every export has

    def chat(self, job: ChatJob) -> ChatOutput:
        """``apply_chat_template`` (chat_template.jinja, which it prefers to tokenizer_config.json's); the stop
        ids of generation_config.json, which its generate reads."""
        import transformers  # noqa: PLC0415 (heavy)
        from transformers import AutoTokenizer, GenerationConfig  # noqa: PLC0415

        tok = AutoTokenizer.from_pretrained(str(job.export_dir))
        ids = {
            k: list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))
            for k, m in job.conversations.items()
        }
        eos = GenerationConfig.from_pretrained(str(job.export_dir)).eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        return ChatOutput(
            ids=ids, stop_ids=eos, end_of_turn_stops=job.end_of_turn in eos, version=transformers.__version__
        )
