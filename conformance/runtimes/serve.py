"""The chat contract of ``prodip serve``: it renders with ``prodip.base.chat.render`` (the reference itself), so
the chat contract asks it only for its stop ids: generation_config.json's ``eos_token_id``, the file it reads.

    python -c "from prodip.conformance.runtimes.serve import ServeAdapter; help(ServeAdapter.chat)"
"""

from __future__ import annotations

from typing import Optional

from prodip.conformance.runtimes.common import ChatJob, ChatOutput, RuntimeAdapter

NAME = "prodip serve"


class ServeAdapter(RuntimeAdapter):
    name = NAME

    def available(self) -> Optional[str]:
        return None  # prodip itself

    def chat_applies(self, job: ChatJob) -> bool:
        return True

    def chat(self, job: ChatJob) -> ChatOutput:
        return ChatOutput(ids=None, stop_ids=job.stop_ids, end_of_turn_stops=job.end_of_turn in job.stop_ids)
