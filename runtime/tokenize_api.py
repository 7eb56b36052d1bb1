"""The tokenizer routes vLLM serves, and GET /v1/models/{id}:

    POST /tokenize        {"prompt": "text"} or {"messages": [...]} -> {"count", "max_model_len", "tokens"};
                          llama-server's {"content": "text", "add_special", "with_pieces"} too
    POST /detokenize      {"tokens": [ids]} -> {"prompt": "text", "content": "text"} (vLLM's name, llama.cpp's)
    GET  /tokenizer_info  special tokens, chat template, vocabulary size (lm-eval's tokenizer_backend=remote)
    GET  /v1/models/{id}  one model object (any of the served names)

Tokenizer work runs in a worker thread, never on the engine's.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.concurrency import run_in_threadpool

from .openai_api import APIError, ChatMessageParam, token_text
from .reply_models import Model, TokenizerInfo


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None                         # text ...
    messages: list[ChatMessageParam] | None = Field(None, min_length=1)   # ... or a chat, by the model's template
    add_special_tokens: bool = True                   # text only: the tokenizer's BOS etc.
    add_generation_prompt: bool = True                # messages only
    content: str | None = None                        # llama-server's text ...
    add_special: bool = False                         # ... its BOS off by default,
    parse_special: bool = True                        # special tokens' text read as those tokens,
    with_pieces: bool = False                         # and each id with its piece (text, or bytes that are not UTF-8)


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[StrictInt]


class TokenPiece(BaseModel):
    id: int
    piece: str | list[int]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int] | list[TokenPiece]


class DetokenizeResponse(BaseModel):
    prompt: str
    content: str


def install(app: FastAPI, state, auth: list[Depends]) -> None:
    """Add the routes; `state` is the server's _ServerState."""

    def tokenizer():
        tok = state.engine.engine.tokenizer
        if tok is None:
            raise APIError(400, "this artifact has no tokenizer (it was compiled from a folder without "
                                "tokenizer.json); send token ids to /v1/completions instead", "model")
        return tok

    @app.post("/tokenize", dependencies=auth, response_model=TokenizeResponse)
    async def tokenize(body: TokenizeRequest) -> dict:
        state.check_model(body.model)
        if sum(x is not None for x in (body.prompt, body.messages, body.content)) != 1:
            raise APIError(400, "send exactly one of prompt (text), messages (a chat) and content (llama-server's "
                                "text)", "prompt")
        if not body.parse_special:
            raise APIError(400, "parse_special false is not implemented: kiln's tokenizer reads special tokens' text "
                                "as those tokens", "parse_special")
        tok = tokenizer()
        if body.content is not None:
            ids = await run_in_threadpool(tok.encode, body.content, body.add_special)
        elif body.messages is not None:
            def render() -> list[int]:
                from .openai_api import chat_messages
                text = tok.apply_chat_template(chat_messages(body.messages),
                                               add_generation_prompt=body.add_generation_prompt)
                return tok.encode(text, add_special_tokens=False)
            try:
                ids = await run_in_threadpool(render)
            except ValueError as e:            # bad roles or a template that refused them
                raise APIError(400, str(e), "messages") from None
        else:
            ids = await run_in_threadpool(tok.encode, body.prompt, body.add_special_tokens)
        tokens = [{"id": i, "piece": _piece(tok, i)} for i in ids] if body.with_pieces else ids
        return {"count": len(ids), "max_model_len": state.context_window, "tokens": tokens}

    @app.post("/detokenize", dependencies=auth, response_model=DetokenizeResponse)
    async def detokenize(body: DetokenizeRequest) -> dict:
        state.check_model(body.model)
        tok = tokenizer()
        bad = [t for t in body.tokens if not 0 <= t < tok.vocab_size]
        if bad:
            raise APIError(400, f"token {bad[0]} is outside the vocabulary [0, {tok.vocab_size})", "tokens")
        text = await run_in_threadpool(tok.decode, body.tokens)
        return {"prompt": text, "content": text}

    @app.get("/tokenizer_info", dependencies=auth, response_model=TokenizerInfo)
    async def tokenizer_info() -> dict:
        tok = tokenizer()
        return {**tok.info(), "vocab_size": tok.vocab_size, "model_max_length": state.context_window,
                "eos_token_ids": sorted(tok.eos_token_ids), "bos_token_id": tok.bos_token_id}

    @app.get("/v1/models/{model_id}", dependencies=auth, response_model=Model)
    async def model(model_id: str) -> dict:
        state.check_model(model_id)
        return state.model_card(model_id)



def _piece(tok, token_id: int) -> str | list[int]:
    """llama-server's piece: a token's text, or its bytes where they are not UTF-8 on their own."""
    raw = token_text(tok, token_id)[1]
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return list(raw)
