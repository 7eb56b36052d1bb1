"""/v1/embeddings: the final hidden state of each input's last token, L2-normalised, equal to the same
pooling of transformers' hidden states within 1e-4 (also for an embedding model saved as its base model, without
an LM head: Qwen3-Embedding's layout); `dimensions` truncates and renormalises; through the openai SDK and
langchain-openai."""

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


def test_dimensions_truncate_and_renormalise(served):
    """Matryoshka truncation: the first `dimensions` values of the full embedding, L2-normalised again."""
    client = served.client()
    full = np.asarray(client.embeddings.create(model="tiny-embed", input="x").data[0].embedding)
    short = np.asarray(client.embeddings.create(model="tiny-embed", input="x", dimensions=8).data[0].embedding)
    assert short.shape == (8,)
    np.testing.assert_allclose(short, full[:8] / np.linalg.norm(full[:8]), atol=1e-6, rtol=0)


def test_embeddings_refuse_what_they_cannot_do(served):
    import openai
    client = served.client()
    with pytest.raises(openai.BadRequestError, match=r"dimensions 100000 exceeds the model's embedding size \(\d+\)"):
        client.embeddings.create(model="tiny-embed", input="x", dimensions=100000)
    with pytest.raises(openai.BadRequestError, match="dimensions must be at least 1"):
        client.embeddings.create(model="tiny-embed", input="x", dimensions=0)
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


def test_an_embedding_model_saved_as_its_base_model(tmp_path):
    """Qwen3-Embedding's layout: transformers' Qwen3Model saved (embed_tokens, layers.*, norm at the root, no LM
    head): read as the qwen3 causal LM with its tensors under model. and the table as its head; its embeddings are
    Qwen3Model's last hidden state at the last token, normalised."""
    import json

    import transformers

    import kiln
    from kiln.models import load
    from tiny_models import write_tokenizer
    cfg = transformers.Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen3Model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08 if p.ndim == 2 else 0.3).add_(1.0 if p.ndim == 1 else 0.0)
    model.save_pretrained(tmp_path / "hf")
    write_tokenizer(tmp_path / "hf", 512)
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3Model"]
    source = load(tmp_path / "hf")
    assert "model.embed_tokens.weight" in source.weights.names() and source.hf_config["tie_word_embeddings"]
    assert any("no LM head" in n for n in source.notes)
    art = kiln.compile(str(tmp_path / "hf"), target="cpu", quant="q0f32", output=tmp_path / "art", golden=False)
    engine = kiln.Engine(art)
    inputs = [[5, 6, 7, 8, 9], [300, 2, 17]]
    for ids, (vector, n) in zip(inputs, engine.embed(inputs)):
        with torch.no_grad():
            h = model(torch.tensor([ids])).last_hidden_state[0, -1].double().numpy()
        np.testing.assert_allclose(vector, h / np.linalg.norm(h), atol=TOL, rtol=0)
        assert n == len(ids)


def _post(served, path: str, body: dict):
    import httpx
    return httpx.post(f"{served.url}{path}", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)


def test_score_and_rerank_are_the_embeddings_cosine(served, tiny_dirs):
    """vLLM's /v1/score and /v1/rerank with an embedding model: the cosine similarity of the two texts' embeddings
    (against transformers' pooling); one text_1 for every text_2 or one each; rerank best first, top_n of them."""
    import transformers
    from kiln.runtime.tokenizer import Tokenizer
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_dirs["tied"], torch_dtype=torch.float32).eval()
    tok = Tokenizer.from_dir(tiny_dirs["tied"])
    query, docs = "paged attention", ["The KV cache lives in pages.", "A fox jumps.", "Batching shares weights."]
    q = reference_embedding(ref, tok.encode(query))
    want = [float(q @ reference_embedding(ref, tok.encode(d))) for d in docs]
    scored = _post(served, "/v1/score", {"model": "tiny-embed", "text_1": query, "text_2": docs}).json()
    assert [d["index"] for d in scored["data"]] == [0, 1, 2] and scored["object"] == "list"
    np.testing.assert_allclose([d["score"] for d in scored["data"]], want, atol=TOL, rtol=0)
    assert scored["usage"]["prompt_tokens"] == sum(len(tok.encode(t)) for t in [query, *docs])
    pairwise = _post(served, "/score", {"text_1": docs[:2], "text_2": [docs[1], docs[0]]}).json()
    assert np.isclose(pairwise["data"][0]["score"], pairwise["data"][1]["score"], atol=1e-6)
    ranked = _post(served, "/v1/rerank", {"query": query, "documents": docs, "top_n": 2}).json()
    best = sorted(range(3), key=lambda i: -want[i])[:2]
    assert [r["index"] for r in ranked["results"]] == best
    assert [r["document"]["text"] for r in ranked["results"]] == [docs[i] for i in best]
    np.testing.assert_allclose([r["relevance_score"] for r in ranked["results"]], [want[i] for i in best], atol=TOL)
    bare = _post(served, "/v2/rerank", {"query": query, "documents": docs, "return_documents": False}).json()
    assert len(bare["results"]) == 3 and "document" not in bare["results"][0]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
    ("/v1/score", {"text_1": [], "text_2": "c"}, "text_1"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": -1}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["d"], "priority": 2}, "priority"),
    ("/v1/score", {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
])
def test_scores_refuse_what_they_cannot_do(served, path, body, param):
    r = _post(served, path, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
