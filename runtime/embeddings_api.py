"""POST /v1/embeddings, as OpenAI serves it, over the engine's final hidden states.

    client.embeddings.create(model="smollm2", input=["a", "b"])      # floats
    client.embeddings.create(model="smollm2", input=[[1, 2, 3]], encoding_format="base64")

Each input (a string, or token ids) becomes the final-norm hidden state of its last token,
L2-normalised: the pooling decoder-only embedding models use (Engine.embed). `dimensions` keeps the
first that many values, normalised again: Matryoshka (MRL) truncation, as sentence-transformers'
truncate_dim and Qwen3-Embedding's own recipe do (meaningful for models trained so; 1 to the hidden size).
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, StrictInt

from .openai_api import APIError
from .reply_models import EmbeddingList


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None               # OpenAI's end-user id: accepted, it changes no output


def embedding_inputs(req: EmbeddingRequest) -> list[str | list[int]]:
    if req.dimensions is not None and req.dimensions < 1:
        raise APIError(400, f"dimensions must be at least 1, got {req.dimensions}", "dimensions")
    x = req.input
    if isinstance(x, str):
        return [x]
    if not x:
        raise APIError(400, "input is empty; pass a string, a list of strings or token ids", "input")
    if all(isinstance(t, int) for t in x):
        return [list(x)]
    return list(x)


def truncated(vector: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The first `dimensions` values, L2-normalised again (Matryoshka truncation); all of them without."""
    if dimensions is None:
        return vector
    if dimensions > len(vector):
        raise APIError(400, f"dimensions {dimensions} exceeds the model's embedding size ({len(vector)}); pass at "
                       f"most {len(vector)}", "dimensions")
    head = np.asarray(vector[:dimensions], np.float64)
    return (head / max(np.linalg.norm(head), 1e-12)).astype(np.float32)


def install(app: FastAPI, state, auth: list[Depends]) -> None:
    """Add the route; `state` is the server's _ServerState (engine, names, model check)."""

    @app.post("/v1/embeddings", dependencies=auth, response_model=EmbeddingList)
    async def embeddings(body: EmbeddingRequest) -> dict:
        state.check_model(body.model)
        results = await state.engine.embed(embedding_inputs(body))
        data = []
        for i, (vector, _) in enumerate(results):
            vector = truncated(vector, body.dimensions)
            value = (base64.b64encode(np.asarray(vector, "<f4").tobytes()).decode()
                     if body.encoding_format == "base64" else [float(v) for v in vector])
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(n for _, n in results)
        return {"object": "list", "data": data, "model": state.model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
