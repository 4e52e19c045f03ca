"""Per-request sampling state kept by the worker between steps.

The engine sends a request's params and tokens once (``NewSequence``); the worker appends each
token it samples, so penalties and the seeded position index need no resend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from aioengine.messages.sampling_params import SamplingParams


@dataclass(slots=True, eq=False)
class SequenceState:
    request_id: str
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    # Token ids masked while fewer than ``params.min_tokens`` outputs exist: the request's stop
    # ids plus eos (unless ``ignore_eos``). Empty when min_tokens is 0.
    min_tokens_mask_ids: tuple[int, ...] = ()
    # Derived once from params so the per-step batch build is attribute reads only.
    greedy: bool = True
    has_penalty: bool = False
    has_top_k: bool = False
    has_top_p: bool = False
    has_min_p: bool = False
    logit_bias_ids: tuple[int, ...] = ()
    logit_bias_values: tuple[float, ...] = ()
    _prompt_ids_tensor: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def create(cls, request_id: str, params: SamplingParams, prompt_token_ids: list[int],
               output_token_ids: list[int], eos_token_ids: tuple[int, ...]) -> SequenceState:
        mask: tuple[int, ...] = ()
        if params.min_tokens > 0:
            ids = set(params.stop_token_ids)
            if not params.ignore_eos:
                ids.update(eos_token_ids)
            mask = tuple(sorted(ids))
        return cls(
            request_id=request_id,
            params=params,
            prompt_token_ids=list(prompt_token_ids),
            output_token_ids=list(output_token_ids),
            min_tokens_mask_ids=mask,
            greedy=params.temperature == 0.0,
            has_penalty=(params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
                         or params.frequency_penalty != 0.0),
            has_top_k=params.top_k > 0,
            has_top_p=params.top_p < 1.0,
            has_min_p=params.min_p > 0.0,
            logit_bias_ids=tuple(params.logit_bias or ()),
            logit_bias_values=tuple((params.logit_bias or {}).values()),
        )

    def prompt_ids_tensor(self, device: torch.device) -> torch.Tensor:
        """The prompt as a tensor on ``device``, built once (repetition penalty reads it every
        step; the prompt never changes while the state lives)."""
        t = self._prompt_ids_tensor
        if t is None or t.device != device:
            t = torch.tensor(self.prompt_token_ids, dtype=torch.long, device=device)
            self._prompt_ids_tensor = t
        return t

    @property
    def masks_stop_now(self) -> bool:
        return bool(self.min_tokens_mask_ids) and \
            len(self.output_token_ids) < self.params.min_tokens
