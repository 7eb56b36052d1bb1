"""POST /v1/embeddings, as OpenAI serves it, over the engine's final hidden states; and vLLM's /v1/score and
/v1/rerank (also /score, /rerank, /v2/rerank) over the same embeddings, as vLLM scores with an embedding model: the
cosine similarity of two texts' embeddings.

    client.embeddings.create(model="smollm2", input=["a", "b"])      # floats
    client.embeddings.create(model="smollm2", input=[[1, 2, 3]], encoding_format="base64")
    POST /v1/score   {"text_1": "query", "text_2": ["doc a", "doc b"]}      -> data[i].score
    POST /v1/rerank  {"query": "query", "documents": ["doc a", "doc b"], "top_n": 1}   -> results, best first

Each input (a string, or token ids) becomes the final-norm hidden state of its last token,
L2-normalised: the pooling decoder-only embedding models use (Engine.embed). `dimensions` keeps the
first that many values, normalised again: Matryoshka (MRL) truncation, as sentence-transformers'
truncate_dim and Qwen3-Embedding's own recipe do (meaningful for models trained so; 1 to the hidden size).
"""

from __future__ import annotations

import base64
import secrets
import time
from typing import Literal

import numpy as np
from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, StrictInt

from .openai_api import APIError
from .reply_models import EmbeddingList, RerankList, ScoreList


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


class ScoreRequest(BaseModel):
    """vLLM's /v1/score: text_1 against each text_2 (one text_1 for all, or one each)."""

    model_config = ConfigDict(extra="forbid")

    text_1: str | list[str]
    text_2: str | list[str]
    model: str | None = None
    truncate_prompt_tokens: int | None = None     # each text's last this many tokens (-1 or none: all)
    priority: int = 0                             # vLLM's: scores are computed between steps, never queued: 0 only


class RerankRequest(BaseModel):
    """vLLM's (and Cohere's, Jina's) /v1/rerank: the documents ranked by their score against the query."""

    model_config = ConfigDict(extra="forbid")

    query: str
    documents: list[str]
    model: str | None = None
    top_n: int = 0                                # 0: every document
    return_documents: bool = True                 # Cohere's: each result's document text (vLLM's always)
    truncate_prompt_tokens: int | None = None
    priority: int = 0


def score_pairs(text_1: str | list[str], text_2: str | list[str]) -> tuple[list[str], list[str]]:
    """vLLM's pairing: one text_1 against every text_2, or text_1[i] against text_2[i]."""
    left = [text_1] if isinstance(text_1, str) else text_1
    right = [text_2] if isinstance(text_2, str) else text_2
    if not left or not right:
        raise APIError(400, "text_1 and text_2 need at least one text each", "text_1" if not left else "text_2")
    if len(left) != 1 and len(left) != len(right):
        raise APIError(400, f"text_1 has {len(left)} texts and text_2 {len(right)}: send one text_1, or as many "
                            "as text_2", "text_1")
    return left * len(right) if len(left) == 1 else left, right


async def cosine_scores(state, left: list[str], right: list[str], truncate: int | None,
                        priority: int) -> tuple[list[float], int]:
    """The cosine similarity of each pair's embeddings (each text embedded once), and the tokens embedded."""
    if priority:
        raise APIError(400, "priority orders generation requests; scores are embedded between steps, never queued: "
                            "leave it 0", "priority")
    if truncate is not None and truncate != -1 and truncate < 1:
        raise APIError(400, f"truncate_prompt_tokens must be -1 (all) or at least 1, got {truncate}",
                       "truncate_prompt_tokens")
    texts = list(dict.fromkeys([*left, *right]))
    inputs: list[str | list[int]] = texts
    if truncate not in (None, -1):
        inputs = [state.engine.engine.encode(t)[-truncate:] for t in texts]
    results = await state.engine.embed(inputs)
    vectors = {t: np.asarray(v, np.float64) for t, (v, _) in zip(texts, results)}   # unit vectors (Engine.embed)
    return [float(vectors[a] @ vectors[b]) for a, b in zip(left, right)], sum(n for _, n in results)


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

    documented = dict(dependencies=auth, response_model=ScoreList)

    @app.post("/v1/score", **documented)
    @app.post("/score", include_in_schema=False, **documented)
    async def score(body: ScoreRequest) -> dict:
        state.check_model(body.model)
        left, right = score_pairs(body.text_1, body.text_2)
        scores, tokens = await cosine_scores(state, left, right, body.truncate_prompt_tokens, body.priority)
        return {"id": f"score-{secrets.token_hex(12)}", "object": "list", "created": int(time.time()),
                "model": state.model_name,
                "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}

    ranked = dict(dependencies=auth, response_model=RerankList, response_model_exclude_none=True)

    @app.post("/v1/rerank", **ranked)
    @app.post("/rerank", include_in_schema=False, **ranked)
    @app.post("/v2/rerank", include_in_schema=False, **ranked)
    async def rerank(body: RerankRequest) -> dict:
        state.check_model(body.model)
        if not body.documents:
            raise APIError(400, "documents must name at least one document", "documents")
        if body.top_n < 0:
            raise APIError(400, f"top_n must be 0 (every document) or more, got {body.top_n}", "top_n")
        scores, tokens = await cosine_scores(state, [body.query] * len(body.documents), body.documents,
                                             body.truncate_prompt_tokens, body.priority)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:body.top_n or None]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": body.documents[i]}} if body.return_documents else {})} for i in order]
        return {"id": f"rerank-{secrets.token_hex(12)}", "model": state.model_name, "results": results,
                "usage": {"total_tokens": tokens}}
