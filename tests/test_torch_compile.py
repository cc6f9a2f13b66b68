"""bitfold.torch.compile: compiled folds, forward and backward, with the eager exact folds' bits.

Inductor compiles take seconds, so each test compiles few functions: one
function holds every rewritten fold (compiled once per dtype), and the model
tests compile each model once per setting, reusing it for both data orders.
"""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

import bitfold  # noqa: E402
import bitfold.torch as bt  # noqa: E402
from bitfold.torch import compiled, rules  # noqa: E402

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: what inductor's code shows for a fold it generates itself or leaves to ATen
FOLD_MARKS = (
    "atomic_add", "aten.index_put", "aten._unsafe_index_put", "aten.scatter_add",
    "aten.scatter_reduce", "aten._embedding_bag_backward", "aten.index_add",
    "aten._unsafe_masked_index_put",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def no_cache():
    """Inductor's caches off: the pass runs (and reports) on every compile."""
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        yield


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def wide_values(shape, dtype, gen):
    """Values spanning many binary orders, with signs: sums that depend on the order of terms."""
    scale = torch.tensor(2.0).pow(torch.randint(-20, 4, shape, generator=gen))
    sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
    return (torch.rand(shape, generator=gen) * scale * sign).to(dtype)


# -- every rewritten fold, one compiled function per dtype --------------------------------------
K, N, D = 7, 40, 3


def _data(dtype):
    gen = torch.Generator().manual_seed(5)
    idx = torch.randint(0, K, (N,), generator=gen)
    idx[:3] = 0  # one hot bucket
    leaf = {
        name: wide_values(shape, dtype, gen).requires_grad_()
        for name, shape in (("gather", (K, D)), ("embedding", (K, D)), ("bag", (K, D)),
                            ("bag_mean", (K, D)), ("bag_max", (K, D)))
    }  # fmt: skip
    plain = {
        "x": wide_values((K, D), dtype, gen),
        "src": wide_values((N, D), dtype, gen),
        "flat": wide_values((N,), dtype, gen),
    }
    half_ulp = torch.finfo(dtype).eps / 2
    tie = torch.tensor([1.0, half_ulp, half_ulp], dtype=dtype)  # 1 first: rounds back to 1 twice
    plain["x"][0] = 0
    plain["src"][:3] = tie[:, None]
    plain["flat"][:3] = tie
    grads = {name: wide_values((N, D), dtype, gen) for name in ("gather", "embedding")}
    offsets = torch.tensor([0, 5, 5, 17, 30])
    for name in ("bag", "bag_mean", "bag_max"):
        grads[name] = wide_values((len(offsets), D), dtype, gen)
    return idx, offsets, leaf, plain, grads


def all_folds(idx, offsets, leaf, plain):
    """Every fold the pass rewrites: forward folds of ``plain``, gathers whose backward folds."""
    x, src, flat = plain["x"], plain["src"], plain["flat"]
    rows = idx[:, None].expand(N, D)
    forward = {
        "index_add": x.index_add(0, idx, src),
        "index_add_alpha_dim1": x.t().index_add(1, idx, src.t(), alpha=0.5),
        "scatter_add": x.scatter_add(0, rows, src),
        "scatter_sum": x.scatter_reduce(0, rows, src, "sum", include_self=False),
        "scatter_mean": x.scatter_reduce(0, rows, src, "mean"),
        "scatter_reduce_add": x.scatter(0, rows, src, reduce="add"),
        "index_put": torch.index_put(x, (idx,), src, accumulate=True),
        "put": x.put(idx, flat, accumulate=True),
        "index_reduce_mean": x.index_reduce(0, idx, src, "mean"),
    }
    outputs = {
        "gather": leaf["gather"][idx],
        "embedding": F.embedding(idx, leaf["embedding"]),
        "bag": F.embedding_bag(idx, leaf["bag"], offsets, mode="sum"),
        "bag_mean": F.embedding_bag(idx, leaf["bag_mean"], offsets, mode="mean"),
        "bag_max": F.embedding_bag(idx, leaf["bag_max"], offsets, mode="max"),
    }
    return forward, outputs


def run_all(fn, dtype):
    idx, offsets, leaf, plain, grads = _data(dtype)
    forward, outputs = fn(idx, offsets, leaf, plain)
    names = sorted(outputs)
    got = torch.autograd.grad([outputs[n] for n in names], [leaf[n] for n in names],
                              [grads[n] for n in names])  # fmt: skip
    return forward, dict(zip(names, got, strict=True))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_rewritten_fold_gives_the_eager_exact_bits(dtype, no_cache):
    with bt.exact_mode() as mode:
        want_fwd, want_bwd = run_all(all_folds, dtype)
    assert mode.counts["embedding_bag_backward"] == 3
    fn = bt.compile(all_folds, fullgraph=True)
    got_fwd, got_bwd = run_all(fn, dtype)
    for name in want_fwd:
        assert same_bits(got_fwd[name], want_fwd[name]), name
    for name in want_bwd:
        assert same_bits(got_bwd[name], want_bwd[name]), name
    report = fn.bitfold
    assert not report.passed and report.graphs == 2  # forward and backward
    assert {"index_put", "scatter_add", "scatter_reduce", "embedding_dense_backward",
            "embedding_bag_backward"} <= set(report.counts)  # fmt: skip
    # and plain torch.compile does not: the hot bucket's terms in its order
    plain_fwd, _ = run_all(torch.compile(all_folds, fullgraph=True), dtype)
    assert any(not same_bits(plain_fwd[n], want_fwd[n]) for n in want_fwd)


def code_lines(codes: list[str]) -> str:
    """Inductor's generated code without its comments (which name the source ATen ops)."""
    return "\n".join(
        line for code in codes for line in code.splitlines() if not line.lstrip().startswith("#")
    )


def test_no_fold_is_left_in_the_generated_code(no_cache):
    dtype = torch.float32
    fn = bt.compile(all_folds, fullgraph=True)
    _, codes = run_and_get_code(lambda: run_all(fn, dtype))
    assert len(codes) == 2  # forward and backward
    text = code_lines(codes)
    assert not [mark for mark in FOLD_MARKS if mark in text]
    assert "torch.ops.bitfold.exact_" in text
    torch._dynamo.reset()
    _, plain = run_and_get_code(lambda: run_all(torch.compile(all_folds, fullgraph=True), dtype))
    assert [mark for mark in FOLD_MARKS if mark in code_lines(plain)]  # the marks do show folds


# -- whole models in two data orders ------------------------------------------------------------
HALF_ULP = 2.0**-24


def _graph(n=40, seed=0):
    """A random graph plus three edges 1 -> 0 weighted 1, 2^-24, 2^-24 (node 0 gets no other).

    Summed in that order node 0's terms round back to 1; in the reverse order
    they give 1 + 2^-23: a fold in edge order depends on the order.
    """
    g = torch.Generator().manual_seed(seed)
    src = torch.cat([torch.tensor([1, 1, 1]), torch.randint(0, n, (6 * n,), generator=g)])
    dst = torch.cat([torch.tensor([0, 0, 0]), torch.randint(1, n, (6 * n,), generator=g)])
    x = torch.randn(n, 6, generator=g) * 2.0 ** torch.randint(-8, 8, (n, 1), generator=g)
    x[1] = 1.0
    weight = torch.rand(src.numel(), generator=g) + 0.5
    weight[:3] = torch.tensor([1.0, HALF_ULP, HALF_ULP])
    return x, torch.stack([src, dst]), weight


def _orders(n):
    """The edge (or bag) order as given, and reversed."""
    return [torch.arange(n), torch.arange(n).flip(0)]


class MessagePassing(torch.nn.Module):
    """Two layers: gather along the edges, weight, fold into the destinations (index_add, then
    scatter_add with an index expanded along the features); linear maps act on nodes."""

    def __init__(self, d=6, classes=3):
        super().__init__()
        self.first = torch.nn.Linear(d, d)
        self.second = torch.nn.Linear(d, classes)
        with torch.no_grad():  # node 1's features reach node 0 as they are
            self.first.weight.copy_(torch.eye(d))
            self.first.bias.zero_()

    def forward(self, x, edges, weight):
        src, dst = edges
        h = self.first(x)
        agg = torch.zeros_like(h).index_add(0, dst, h[src] * weight[:, None])
        m = self.second(torch.relu(agg) + h)
        rows = dst[:, None].expand(-1, m.shape[1])
        return torch.zeros_like(m).scatter_add(0, rows, m[src] * weight[:, None])


def _gcn():
    from torch_geometric.nn import GCNConv

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = GCNConv(6, 6, normalize=False, add_self_loops=False)
            self.second = GCNConv(6, 3)  # normalised: the degrees are a fold too
            with torch.no_grad():
                self.first.lin.weight.copy_(torch.eye(6))

        def forward(self, x, edges, weight):
            return self.second(torch.relu(self.first(x, edges, weight)), edges, weight)

    return GCN()


def graph_case(build):
    def run(compile_fn):
        x, edges, weight = _graph()
        torch.manual_seed(0)
        model = build()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        step = compile_fn(model)
        target = torch.randn(x.shape[0], 3, generator=torch.Generator().manual_seed(1))
        digests = []
        for order in [*_orders(edges.shape[1]), _orders(edges.shape[1])[1]]:  # B twice
            model.load_state_dict(start)
            model.zero_grad(set_to_none=True)
            out = step(x, edges[:, order], weight[order])
            (out * target).sum().backward()  # d loss / d out = target, whatever the order
            tensors = {"out": out.detach()}
            with torch.no_grad():
                for name, p in model.named_parameters():
                    tensors[f"grad.{name}"] = p.grad.clone()
                    p -= 0.125 * p.grad
                    tensors[name] = p.clone()
            digests.append(bitfold.digest(tensors))
        return digests, step

    return run


class Bags(torch.nn.Module):
    def __init__(self, rows=30, d=4, mode="sum"):
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(rows, d, mode=mode)

    def forward(self, ids, offsets):
        return self.bag(ids, offsets)


def bag_case(mode):
    """Bags of ids in two orders of the bags; id 0 in the first three bags, whose output
    gradients are 1, 2^-24, 2^-24 in its first column."""

    def run(compile_fn):
        g = torch.Generator().manual_seed(2)
        lengths = torch.randint(1, 6, (24,), generator=g)
        bags = [torch.randint(1, 30, (int(n),), generator=g) for n in lengths]
        for b in bags[:3]:
            b[0] = 0
        target = torch.randn(len(bags), 4, generator=g)
        target[:3, 0] = torch.tensor([1.0, HALF_ULP, HALF_ULP])
        if mode == "mean":  # one id per bag: the mean divides by 1
            bags[:3] = [torch.tensor([0])] * 3
        torch.manual_seed(0)
        model = Bags(mode=mode)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        step = compile_fn(model)
        digests = []
        for order in [*_orders(len(bags)), _orders(len(bags))[1]]:
            model.load_state_dict(start)
            model.zero_grad(set_to_none=True)
            chosen = [bags[i] for i in order]
            offsets = torch.tensor([0, *torch.tensor([len(b) for b in chosen]).cumsum(0)[:-1]])
            out = step(torch.cat(chosen), offsets)
            (out * target[order]).sum().backward()
            grad = model.bag.weight.grad.clone()
            inverse = torch.argsort(order)
            digests.append(bitfold.digest({"out": out.detach()[inverse], "grad": grad}))
        return digests, step

    return run


def hashed_case(layer):
    """A hashed layer W = v[h] (out x in, K buckets), its output rows in two orders.

    Rows 0, 1, 2 put column 0 in bucket 0; with an input of ones, their
    weight gradients are the output gradients 1, 2^-24, 2^-24.
    """

    def run(compile_fn):
        out_f, in_f, K = 12, 5, 7
        g = torch.Generator().manual_seed(3)
        h = torch.randint(1, K, (out_f, in_f), generator=g)
        h[:3, 0] = 0
        x = torch.ones(1, in_f)
        target = torch.randn(1, out_f, generator=g)
        target[0, :3] = torch.tensor([1.0, HALF_ULP, HALF_ULP])
        torch.manual_seed(0)
        v0 = torch.randn(K)
        digests = []
        for order in [*_orders(out_f), _orders(out_f)[1]]:
            torch._dynamo.reset()  # the index map is part of the model
            model = layer(h[order], K)
            with torch.no_grad():
                model.shared_weight.copy_(v0)
            step = compile_fn(model)
            out = step(x)
            (out * target[:, order]).sum().backward()
            v = model.shared_weight
            digests.append(bitfold.digest({"out": out.detach()[:, torch.argsort(order)],
                                           "grad": v.grad.clone()}))  # fmt: skip
        return digests, step

    return run


class PlainHashed(torch.nn.Module):
    """A hashed layer in plain PyTorch: ``W = v[h]``, whose gradient is index_put's fold."""

    def __init__(self, h, K):
        super().__init__()
        self.register_buffer("h", h)
        self.shared_weight = torch.nn.Parameter(torch.zeros(K))

    def forward(self, x):
        return x @ self.shared_weight[self.h].t()


def folded_linear(h, K):
    layer = bt.FoldedLinear(h.shape[1], h.shape[0], K, bias=False, plan=bitfold.Fold(h, K))
    return layer


CASES = {
    "message-passing": graph_case(MessagePassing),
    "embedding-bag-sum": bag_case("sum"),
    "embedding-bag-mean": bag_case("mean"),
    "hashed-v[h]": hashed_case(PlainHashed),
    "gcn": graph_case(_gcn),
}


@pytest.mark.parametrize("name", [n for n in CASES if n != "gcn"])
def test_compiled_models_give_one_digest_for_any_data_order(name):
    digests, _ = CASES[name](bt.compile)
    assert len(set(digests)) == 1, digests
    plain, _ = CASES[name](torch.compile)
    assert plain[0] != plain[1]  # plain torch.compile: the order changes the bits


def test_folded_linear_compiles_whole_and_exact():
    digests, step = hashed_case(folded_linear)(bt.compile)
    assert len(set(digests)) == 1
    assert not step.bitfold.passed


@pytest.mark.slow
def test_compiled_gcn_conv_gives_one_digest_for_any_edge_order():
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    digests, _ = CASES["gcn"](bt.compile)
    assert len(set(digests)) == 1, digests
    plain, _ = CASES["gcn"](torch.compile)
    assert plain[0] != plain[1]


# -- caches, reports, modes, options -------------------------------------------------------------
TIE = torch.tensor([1.0, HALF_ULP, HALF_ULP])
ONE_BUCKET = torch.tensor([0, 0, 0])


def tie_fold(x, v):
    return x.index_add(0, ONE_BUCKET, v)


def test_fx_graph_cache_keeps_exact_and_plain_graphs_apart():
    plain_bits, exact_bits = 1.0, 1.0 + 2 * HALF_ULP  # 1 + 2^-24 + 2^-24 in order, and exact
    with (
        torch._inductor.config.patch(fx_graph_cache=True),
        torch._functorch.config.patch(enable_autograd_cache=True),
    ):
        for comp, want in [(torch.compile, plain_bits), (bt.compile, exact_bits)] * 2:
            torch._dynamo.reset()
            # two buckets, not one: torch 2.13's inductor fails to generate the C++ of an
            # index_add into a single element when torch runs more than one thread
            assert comp(tie_fold)(torch.zeros(2), TIE)[0].item() == want, comp
    hits = (
        counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    )
    assert hits >= 2  # the second round came from the caches


def test_a_fold_it_cannot_make_exact_is_reported_or_refused(no_cache):
    def prod(x, v):
        return x.scatter_reduce(0, ONE_BUCKET, v, "prod"), x.index_add(0, ONE_BUCKET, v)

    fn = bt.compile(prod)
    fn(torch.ones(1), TIE)
    assert fn.bitfold.passed == {"scatter_reduce: reduce='prod': a product, not a sum": 1}
    assert fn.bitfold.counts["index_put"] == 1
    torch._dynamo.reset()
    with pytest.raises(bitfold.FoldError, match=r"strict=True.*scatter_reduce.*prod"):
        bt.compile(prod, strict=True)(torch.ones(1), TIE)
    torch._dynamo.reset()
    ints = bt.compile(tie_fold, strict=True)  # integer sums are exact already: not refused
    assert ints(torch.zeros(1, dtype=torch.int64), torch.tensor([1, 2, 3])).item() == 6


def test_an_id_out_of_range_in_a_compiled_fold_is_one_bitfold_error():
    """Raised as bitfold's own error, alone: no chain, none of torch's frames in between."""
    import traceback

    fn = bt.compile(lambda x, i, v: x.index_add(0, i, v))
    fn(torch.zeros(3), torch.tensor([0, 1]), torch.ones(2))
    with pytest.raises(bitfold.IndexRangeError, match=r"index\[1\] = 5 .* out of range") as info:
        fn(torch.zeros(3), torch.tensor([0, 5]), torch.ones(2))
    err = info.value
    assert err.__cause__ is None and err.__suppress_context__
    assert len(traceback.extract_tb(err.__traceback__)) <= 2


def test_options_mode_and_the_users_own_pass_are_kept(no_cache):
    seen = []

    class Mine(torch._inductor.custom_graph_pass.CustomGraphPass):
        def __call__(self, graph):
            seen.append(sum(n.op == "call_function" for n in graph.nodes))

        def uuid(self):
            return "mine"

    fn = bt.compile(tie_fold, options={"post_grad_custom_post_pass": Mine(), "max_autotune": True})
    assert fn(torch.zeros(1), TIE).item() == 1.0 + 2 * HALF_ULP
    assert seen and fn.bitfold.counts["index_put"] == 1
    with pytest.raises(bitfold.FoldError, match="backend must be 'inductor'"):
        bt.compile(tie_fold, backend="eager")
    opts = compiled._options("max-autotune", None, None, compiled.CompileReport())
    assert opts["max_autotune"] is True  # the mode's options, merged with the pass


@pytest.mark.parametrize(
    "kwargs", [{"fullgraph": True}, {"dynamic": True}, {"mode": "max-autotune"}], ids=str
)
def test_fullgraph_dynamic_and_max_autotune(kwargs, no_cache):
    x, edges, weight = _graph()
    model = MessagePassing()
    before = counters["stats"]["unique_graphs"]
    breaks = sum(counters["graph_break"].values())
    step = bt.compile(model, **kwargs)
    for n in (edges.shape[1], edges.shape[1] - 5):  # a second size: dynamic shapes
        got = step(x, edges[:, :n], weight[:n])
        with bt.exact_mode():
            want = model(x, edges[:, :n], weight[:n])
        assert same_bits(got.detach(), want.detach())  # both folds exact, nothing else between
    assert counters["stats"]["unique_graphs"] > before  # compiled: no eager fallback
    assert sum(counters["graph_break"].values()) == breaks
    report = step.bitfold
    assert report.counts["index_put"] >= 1 and report.counts["scatter_add"] >= 1
    assert not report.passed


def test_exact_mode_around_a_compiled_function(no_cache):
    x, edges, weight = _graph()
    model = MessagePassing()
    step = bt.compile(model)
    before = counters["stats"]["unique_graphs"]
    with bt.exact_mode() as mode:  # first call inside the mode: runs op by op, exact
        inside = step(x, edges, weight)
    assert mode.counts["index_add"] == 1 and counters["stats"]["unique_graphs"] == before
    outside = step(x, edges, weight)  # later calls outside still compile
    assert counters["stats"]["unique_graphs"] == before + 1
    assert same_bits(inside.detach(), outside.detach())
    with bt.exact_mode():  # a backward inside the mode through bitfold's compiled graph
        outside.sum().backward()
    torch._dynamo.reset()
    plain = torch.compile(MessagePassing())(x, edges, weight)
    with pytest.raises(bitfold.FoldError, match="compiled outside the mode"), bt.exact_mode():
        plain.sum().backward()


def test_rules_table_and_docstrings():
    assert rules.rule_for(torch.ops.aten.index_put_.default).kind == "index_put"
    assert rules.rule_for(torch.ops.aten.add.Tensor) is None
    for op in rules.COMPILED:
        assert hasattr(torch.ops.bitfold, rules.op_name(op))
    for module in (rules, compiled):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def _eager_fold_step():
    """A step whose fold runs eagerly, in a frame Dynamo skips: what that frame calls, it
    watches."""

    def eager_part(y, idx, v):
        return torch.index_add(y, 0, idx, v)

    eager = torch._dynamo.disable(eager_part, recursive=False)

    def step(x, idx, v):
        return eager(x * 2.0, idx, v) + 0.0

    return step


def _run_and_compiled_files(fn, *args, calls: int = 4):
    """``fn(*args)`` after ``calls`` calls, and the files of the frames Dynamo compiled."""
    from torch._dynamo.convert_frame import register_bytecode_hook

    files = []
    handle = register_bytecode_hook(lambda code, _new: files.append(code.co_filename))
    try:
        for _ in range(calls):
            got = fn(*args)
    finally:
        handle.remove()
    return got, files


@pytest.mark.parametrize("shield", ["mark", "wrapper"])
def test_torch_compile_never_compiles_the_fold_kernels_left_installed(shield, monkeypatch):
    """After an exact mode, the fold kernels stay installed (each fold op calls Python): an
    eager fold of a function compiled by plain ``torch.compile`` (in a frame Dynamo skips) runs
    the kernel as a new frame, which Dynamo must skip with all it calls (else it compiled the
    kernel again at every call, its counter guarded). Shielded by the mark on the kernels'
    code, or (a torch without it) by ``torch._dynamo.disable``."""
    from bitfold.torch import mode

    if shield == "wrapper":
        if mode._SKIP_WITH_CALLEES is not None:  # a mark stays on a code: take the kernels' off
            from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy

            set_strategy, _skip = mode._SKIP_WITH_CALLEES
            unmarked = _FrameExecStrategy(_FrameAction.DEFAULT, _FrameAction.DEFAULT)
            set_strategy(mode._fold_kernel(torch.ops.aten.index_add_.default).__code__, unmarked)
        monkeypatch.setattr(mode, "_SKIP_WITH_CALLEES", None)
        mode._uninstall_kernels()  # installed again below, wrapped
    try:
        with bt.exact_mode():
            torch.zeros(3).index_add_(0, torch.tensor([0]), torch.ones(1))
        _check_no_kernel_compiled()
    finally:
        if shield == "wrapper":
            mode._uninstall_kernels()  # the next mode installs them marked


def _check_no_kernel_compiled():
    """Plain ``torch.compile`` of the eager-fold step compiles this file's frames, none of
    bitfold's."""
    fn = torch.compile(_eager_fold_step(), backend="eager")
    got, compiled_files = _run_and_compiled_files(
        fn, torch.zeros(3), torch.tensor([0, 0, 2]), torch.tensor([1.0, 2.0, 3.0])
    )
    assert got.tolist() == [3.0, 0.0, 3.0]
    assert __file__ in compiled_files  # Dynamo did compile this test's frames
    package = str(Path(bitfold.__file__).parent)
    assert not [f for f in compiled_files if f.startswith(package)]


def test_an_eager_fold_after_a_graph_break_compiles_nothing_of_bitfold(no_cache):
    """An eager fold of a compiled function (after a graph break) runs bitfold's exact rules
    unseen by Dynamo, which compiled the mode's own Python (its checks, its kernels) as frames
    of their own, and a kernel again at every call (its counter is guarded)."""
    fn = bt.compile(_eager_fold_step())
    idx = torch.tensor([0, 0, 0, 2])
    v = torch.tensor([1e8, 1.0, -1e8, 3.0])
    got, compiled_files = _run_and_compiled_files(fn, torch.zeros(3), idx, v)
    assert got.tolist() == [1.0, 0.0, 3.0]  # exact: float32 additions in order lose the 1.0
    assert fn.bitfold.counts["index_add"] == 4
    assert __file__ in compiled_files  # Dynamo did compile this test's frames
    package = str(Path(bitfold.__file__).parent)
    assert not [f for f in compiled_files if f.startswith(package)]
