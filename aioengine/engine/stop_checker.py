"""Decide whether a request is done after a token was appended (token-level stops only;
stop strings are matched where the text is, by the detokenizer)."""

from __future__ import annotations

from aioengine.engine.request import FinishReason, Request


def check_stop(req: Request, token_id: int, max_model_len: int) -> bool:
    """Finish ``req`` if ``token_id`` (already appended) ends it; return whether it did.
    Order: eos / stop token ids (only once ``min_tokens`` are out), then ``max_tokens``, then
    the context length."""
    params = req.params
    if req.num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and token_id in req.eos_token_ids:
            req.finish(FinishReason.STOP)
            return True
        if token_id in params.stop_token_ids:
            req.finish(FinishReason.STOP, stop_token_id=token_id)
            return True
    if req.num_output_tokens >= params.max_tokens or req.num_tokens >= max_model_len:
        req.finish(FinishReason.LENGTH)
        return True
    return False
