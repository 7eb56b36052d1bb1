"""The server's reply bodies as pydantic models, so /openapi.json and /docs describe every field.

The routes build their replies as dicts (openai_api.Reply, embeddings_api, responses_api, ...);
these models document them (FastAPI `response_model`), and schemathesis checks every reply it
provokes against them (tests/e2e/test_schemathesis.py). Streams are documented as
text/event-stream (STREAM): one JSON chunk per `data:` line, then `data: [DONE]`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

FinishReason = Literal["stop", "length", "tool_calls"]


class PromptTokensDetails(BaseModel):
    cached_tokens: int                  # prompt tokens the prefix cache held (not computed again)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class PromptLogprob(BaseModel):
    """One entry of vLLM's prompt_logprobs: a token's logprob, its rank (1: the likeliest) and its text."""

    logprob: float
    rank: int | None
    decoded_token: str


# -- /v1/chat/completions ---------------------------------------------------------------------
class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class FunctionCall(BaseModel):
    name: str
    arguments: str                        # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None
    reasoning: str | None = None          # a reasoning model's thinking (`kiln serve --reasoning-parser`)
    reasoning_content: str | None = None  # the same, under the name DeepSeek's API and older vLLM use


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: str | None = None        # vLLM's: the stop string that ended the choice (finish_reason stop)


class Timings(BaseModel):
    """llama-server's timings (with timings_per_token): its prompt's evaluation, then its tokens'."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None   # vLLM's, when asked
    timings: Timings | None = None        # llama-server's, with timings_per_token


# -- /v1/completions --------------------------------------------------------------------------

class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]    # None: an echoed prompt's first token (nothing scores it)
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: str | None = None        # vLLM's: the stop string that ended the choice (finish_reason stop)
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None   # vLLM's, when asked


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[CompletionChoice]
    usage: Usage
    timings: Timings | None = None        # llama-server's, with timings_per_token


# -- /v1/embeddings ---------------------------------------------------------------------------
class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str          # floats, or base64 of little-endian float32


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class Score(BaseModel):
    index: int
    object: Literal["score"]
    score: float


class ScoreUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int


class ScoreList(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[Score]
    usage: ScoreUsage


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    total_tokens: int


class RerankList(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


# -- /v1/models, /tokenizer_info, /health -----------------------------------------------------
class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str                             # the served model's name (an alias's too)
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class TokenizerInfo(BaseModel):
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    chat_template: str | None
    vocab_size: int
    model_max_length: int
    eos_token_ids: list[int]
    bos_token_id: int | None


class Health(BaseModel):
    status: Literal["ok"]


class Version(BaseModel):
    version: str


# -- /v1/responses ----------------------------------------------------------------------------
class OutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class OutputMessage(BaseModel):
    type: Literal["message"]
    id: str
    role: Literal["assistant"]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"]
    text: str


class OutputReasoning(BaseModel):
    type: Literal["reasoning"]
    id: str
    summary: list[Any]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[ReasoningText]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str                        # JSON text
    status: Literal["in_progress", "completed", "incomplete"]


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class Response(BaseModel):
    id: str
    object: Literal["response"]
    created_at: int
    model: str
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    error: dict[str, Any] | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    metadata: dict[str, str]
    output: list[OutputReasoning | OutputMessage | OutputFunctionCall]
    parallel_tool_calls: bool
    tool_choice: str | dict[str, Any]
    tools: list[Any]
    store: bool
    temperature: float | None
    top_p: float | None
    text: dict[str, Any]
    reasoning: dict[str, Any] | None = None
    usage: ResponseUsage | None


# -- /v1/messages (Anthropic's Messages API: runtime/messages_api.py) --------------------------
class MessageUsage(BaseModel):
    input_tokens: int                     # the prompt's tokens the prefix cache did not hold
    cache_creation_input_tokens: int
    cache_read_input_tokens: int          # those it held
    output_tokens: int


class Message(BaseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]]         # thinking, text and tool_use blocks
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"] | None
    stop_sequence: str | None
    usage: MessageUsage


class TokenCount(BaseModel):
    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    type: str                             # invalid_request_error, authentication_error, not_found_error, api_error
    message: str


class AnthropicError(BaseModel):
    type: Literal["error"]
    error: AnthropicErrorDetail


ANTHROPIC_ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": AnthropicError, "description": "Bad input, a missing API key or an unknown model"},
    "5XX": {"model": AnthropicError, "description": "The engine failed (500) or the server is shutting down (503)"},
}


# A stream's headers: not cached, and not buffered by a proxy in front (nginx's X-Accel-Buffering).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def with_stream(description: str) -> dict[int | str, dict[str, Any]]:
    """A route's 200 answer documented as JSON (its response_model) or, with stream: true, an event
    stream; the schema describes one event, as schemathesis reads it (OpenAPI 3.2's itemSchema)."""
    event = {"type": "object", "required": ["data"],
             "properties": {"event": {"type": "string"}, "data": {"type": "string", "description": STREAM}}}
    return {200: {"description": description, "content": {"text/event-stream": {"schema": event}}}}


STREAM = ('one JSON object per event (the OpenAI SDK\'s chunk or event objects, or an {"error": ...} that '
          'ends the stream); chat and completions streams end with "[DONE]"')
