"""/v1/embeddings: the final hidden state of each input's last token, L2-normalised, equal to the same
pooling of transformers' hidden states within 1e-4; through the openai SDK and langchain-openai."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from kiln.runtime import EngineConfig
from kiln.runtime.server import ServerArgs
from test_server import API_KEY, running_server

pytestmark = pytest.mark.e2e
TOL = 1e-4


@pytest.fixture(scope="module", params=["engine-thread", "engine-process"])
def served(tiny_artifacts, request):
    """Both ways, as test_server's: the embeddings (float arrays) cross the engine process's pipe."""
    with running_server(tiny_artifacts["tied"], ServerArgs(model_name="tiny-embed", engine=EngineConfig()),
                        engine_process=request.param == "engine-process") as s:
        yield s


def reference_embedding(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        h = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -1].double().numpy()
    return h / np.linalg.norm(h)


def test_embeddings_match_transformers_pooling(served, tiny_dirs):
    import transformers
    from kiln.runtime.tokenizer import Tokenizer
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_dirs["tied"], torch_dtype=torch.float32).eval()
    tok = Tokenizer.from_dir(tiny_dirs["tied"])
    texts = ["The quick brown fox", "Paged attention keeps the KV cache in pages; batching shares the weights."]
    got = served.client().embeddings.create(model="tiny-embed", input=texts)
    assert [d.index for d in got.data] == [0, 1]
    for text, d in zip(texts, got.data):
        ids = tok.encode(text)
        np.testing.assert_allclose(d.embedding, reference_embedding(ref, ids), atol=TOL, rtol=0)
    assert got.usage.prompt_tokens == sum(len(tok.encode(t)) for t in texts) == got.usage.total_tokens
    ids = [5, 6, 7, 8, 9]
    by_ids = served.client().embeddings.create(model="tiny-embed", input=[ids], encoding_format="base64")
    vec = np.frombuffer(base64.b64decode(by_ids.data[0].embedding), "<f4") if isinstance(
        by_ids.data[0].embedding, str) else np.asarray(by_ids.data[0].embedding)
    np.testing.assert_allclose(vec, reference_embedding(ref, ids), atol=TOL, rtol=0)


def test_embeddings_refuse_what_they_cannot_do(served):
    import openai
    client = served.client()
    with pytest.raises(openai.BadRequestError, match="dimensions is not supported"):
        client.embeddings.create(model="tiny-embed", input="x", dimensions=8)
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.embeddings.create(model="tiny-embed", input=[[10**6]])
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="x")


def test_langchain_openai_embeddings(served):
    langchain_openai = pytest.importorskip("langchain_openai")
    emb = langchain_openai.OpenAIEmbeddings(model="tiny-embed", base_url=f"{served.url}/v1", api_key=API_KEY,
                                            check_embedding_ctx_length=False)
    vectors = emb.embed_documents(["one document", "another"])
    query = emb.embed_query("one document")
    assert len(vectors) == 2 and np.allclose(vectors[0], query, atol=1e-5)
    assert abs(np.linalg.norm(query) - 1) < 1e-4
