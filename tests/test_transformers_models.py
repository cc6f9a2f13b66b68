"""Tiny transformers models (built from configs, random weights, no download) under
``bitfold.torch.compile``: they compile and train, ``strict=True`` passes, the folds are
counted, and the embedding gradient is the same bits for a permuted batch."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")
transformers = pytest.importorskip("transformers", reason="the test extras install transformers")

import bitfold.torch as bt  # noqa: E402

warnings.filterwarnings("ignore", message=".*loss_type.*")
VOCAB, BATCH, TOKENS = 300, 4, 16


def _mixtral(experts: str):
    config = transformers.MixtralConfig(
        num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=TOKENS,
    )  # fmt: skip
    config._experts_implementation = experts
    return transformers.MixtralForCausalLM(config)


def _gpt2():
    # untied: a tied table's gradient adds the output layer's, a dense product over the batch
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB,
                                     n_positions=TOKENS, tie_word_embeddings=False,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


MODELS = {
    "mixtral grouped_mm experts": lambda: _mixtral("grouped_mm"),
    "mixtral eager experts": lambda: _mixtral("eager"),
    "gpt2": _gpt2,
}


def _embedding_grad(step, model, ids):
    model.zero_grad(set_to_none=True)
    out = step(input_ids=ids)
    # a per-token loss whose terms do not depend on where the token sits in the batch
    out.logits.float().square().mean(-1).sum().backward()
    return model.get_input_embeddings().weight.grad.detach().clone()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_compiles_trains_and_folds_exactly(name):
    torch._dynamo.reset()
    torch.manual_seed(0)
    try:
        model = MODELS[name]()
    except (ValueError, KeyError, TypeError) as exc:  # an experts kind this version lacks
        pytest.skip(f"transformers {transformers.__version__} cannot build {name}: {exc}")
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(1))
    ids[:, :3] = 7  # one hot token: its gradient rows are a fold of many terms
    step = bt.compile(model, strict=True)
    grad = _embedding_grad(step, model, ids)
    perm = torch.tensor([2, 0, 3, 1])
    permuted = _embedding_grad(step, model, ids[perm])
    assert torch.equal(grad.view(torch.int32), permuted.view(torch.int32))
    report = step.bitfold
    assert report.counts["embedding_dense_backward"] >= 1, report
    assert not report.passed, report
    if name.startswith("mixtral"):  # the experts' token combine is a fold too
        assert report.counts["index_put"] + report.counts["index_add"] >= 1, report
    torch._dynamo.reset()
