"""One validator for every entry point: the same refusals from NumPy, torch, JAX, the accumulator.

A transposed gradient (the index's size, another multi-dimensional shape)
would be folded into the wrong buckets; every entry point refuses it with
both shapes in the message. (The CUDA entry points are checked in
``tests/cuda_cases.py`` under the simulator.)
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import bitfold

INDEX = np.random.default_rng(0).integers(0, 5, size=(2, 3))
TRANSPOSED = np.ones((3, 2), np.float32)
MESSAGE = r"shape \(3, 2\) but the index has shape \(2, 3\)"


def _numpy(plan):
    return plan(TRANSPOSED)


def _accumulator(plan):
    return plan.accumulator().add(TRANSPOSED)


def _torch_plan(plan):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    return plan(torch.from_numpy(TRANSPOSED))


def _torch_fold(plan):
    pytest.importorskip("torch", reason="torch is not installed")
    import torch

    import bitfold.torch as bt

    return bt.fold(torch.from_numpy(TRANSPOSED), plan)


def _torch_fold_compiled_fake(plan):
    pytest.importorskip("torch", reason="torch is not installed")
    import torch

    import bitfold.torch as bt

    key = bt.plan_key(plan)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.empty(3, 2)
        return torch.ops.bitfold.fold(fake, key, "exact", torch.float32)


def _jax_plan(plan):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    return plan(jnp.asarray(TRANSPOSED))


def _jax_fold(plan):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    import bitfold.jax as bj

    return bj.fold(jnp.asarray(TRANSPOSED), plan)


def _jax_fold_under_jit(plan):
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    import bitfold.jax as bj

    return jax.jit(lambda x: bj.fold(x, plan))(TRANSPOSED)


ENTRY_POINTS = [
    _numpy, _accumulator, _torch_plan, _torch_fold, _torch_fold_compiled_fake, _jax_plan,
    _jax_fold, _jax_fold_under_jit,
]  # fmt: skip


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__.strip("_"))
def test_a_transposed_gradient_is_refused_everywhere(entry):
    plan = bitfold.Fold(INDEX, 5)
    with pytest.raises(bitfold.ShapeError, match=MESSAGE):
        entry(plan)


def test_the_same_values_in_the_index_shape_or_flat_are_folded():
    plan = bitfold.Fold(INDEX, 5)
    want = np.bincount(INDEX.reshape(-1), minlength=5).astype(np.float32)
    assert plan(np.ones((2, 3), np.float32)).tolist() == want.tolist()
    assert plan(np.ones(6, np.float32)).tolist() == want.tolist()


# -- the plan: bugs of the first review ---------------------------------------------------------
def test_a_K_beyond_memory_is_refused_with_how_much_it_would_take():
    with pytest.raises(bitfold.FoldError, match=r"K = 1,000,000,000,000 buckets need 8\.0 TB"):
        bitfold.Fold([0, 1], K=10**12)


def test_an_empty_list_is_an_empty_index():
    plan = bitfold.Fold([], 3)
    assert plan.size == 0 and plan.shape == (0,)
    assert plan(np.zeros(0, np.float32)).view(np.uint32).tolist() == [0, 0, 0]


def test_a_list_of_non_integers_names_the_value():
    with pytest.raises(bitfold.FoldTypeError, match=r"non-integer numbers .* 0\.5"):
        bitfold.Fold([0.5, 1], 3)
    with pytest.raises(bitfold.FoldTypeError, match="float64"):
        bitfold.Fold(np.zeros(0, np.float64), 3)


# -- the accumulator returns the library of the values added ---------------------------------------
def test_accumulator_results_come_back_in_the_library_of_the_values_added():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    plan = bitfold.Fold([0, 1, 1], 2)
    acc = plan.accumulator().add(torch.tensor([1.0, 2.0, 3.0]))
    res = acc.result()
    assert isinstance(res, torch.Tensor) and res.tolist() == [1.0, 5.0]
    assert acc.result(out_dtype=torch.bfloat16).dtype == torch.bfloat16
    np_acc = plan.accumulator().add(np.array([1.0, 2.0, 3.0], np.float32))
    assert isinstance(np_acc.result(), np.ndarray)
    assert isinstance(plan.accumulator().result(), np.ndarray)  # nothing added: NumPy
    state = torch.from_numpy(acc.state.copy())
    rebuilt = bitfold.ExactAccumulator.from_state(plan, state)
    assert isinstance(rebuilt.result(), torch.Tensor)
    merged = plan.accumulator().merge(acc)  # an empty accumulator takes the other's library
    assert isinstance(merged.result(), torch.Tensor)


def test_accumulator_results_from_jax_values_are_jax_arrays():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    plan = bitfold.Fold([0, 1, 1], 2)
    res = plan.accumulator().add(jax.numpy.asarray([1.0, 2.0, 3.0], "float32")).result()
    assert isinstance(res, jax.Array) and res.tolist() == [1.0, 5.0]


def test_messages_name_only_what_the_user_passed():
    """add_at and torch's index_add have no K: their range errors name the bound they had."""
    import torch

    import bitfold.torch as bt

    with pytest.raises(bitfold.IndexRangeError, match=r"-3 <= indices < len\(a\) = 3$") as e:
        bitfold.add_at(np.zeros(3, np.float32), np.array([0, 5]), np.ones(2, np.float32))
    assert "K" not in str(e.value)
    with pytest.raises(bitfold.IndexRangeError, match=r"index < input.shape\[0\] = 3$") as e:
        bt.index_add(torch.zeros(3), 0, torch.tensor([0, 5]), torch.ones(2))
    assert "K" not in str(e.value) and "= 5" in str(e.value)
    with pytest.raises(bitfold.IndexRangeError, match=r"index < K = 3$"):
        bitfold.Fold(np.array([0, 5]), 3)


def test_a_one_dimensional_shape_mismatch_names_one_form():
    with pytest.raises(bitfold.ShapeError) as e:
        bitfold.segment_sum(np.ones(2, np.float32), np.array([0, 1, 2]), 3)
    msg = str(e.value)
    assert msg.endswith("pass values of shape (3,) + trailing") and " or " not in msg
    with pytest.raises(bitfold.ShapeError, match=r"\(2, 3\) \+ trailing or \(6,\) \+ trailing"):
        bitfold.Fold(np.zeros((2, 3), np.int64), 3)(np.ones(5, np.float32))


def test_an_index_range_error_is_also_an_index_error():
    """Code written for torch (IndexError) and for bitfold (FoldError, ValueError) catches it."""
    with pytest.raises(IndexError):
        bitfold.Fold(np.array([0, 9]), 3)
    with pytest.raises(ValueError):
        bitfold.Fold(np.array([0, 9]), 3)


# -- every refusal is one bitfold error, raised before any work ------------------------------------
def one_error(err):
    """One error: no cause, and no context shown (``raise ... from None`` or raised outside)."""
    assert err.__cause__ is None
    assert err.__context__ is None or err.__suppress_context__


def _torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import bitfold.torch as bt

    return torch, bt


def _jax():
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    import bitfold.jax as bj

    return jnp, bj


PLAN = bitfold.Fold(np.array([0, 1, 1]), 2)
VALS = np.ones(3, np.float32)


def _engine_calls():
    acc = PLAN.accumulator
    state = np.zeros((2, 15), np.int64)
    return {
        "plan call": (lambda: PLAN(VALS, turbo=1), ["route=", "out_dtype=", "init="]),
        "plan.route": (lambda: PLAN.route(VALS, turbo=1), ["route=", "strategy="]),
        "plan.accumulator": (lambda: acc(turbo=1), ["carry_every=", "backend="]),
        "ExactAccumulator": (lambda: bitfold.ExactAccumulator(PLAN, turbo=1), ["kernel="]),
        "accumulator.add": (lambda: acc().add(VALS, turbo=1), ["values=", "start="]),
        "accumulator.result": (lambda: acc().result(turbo=1), ["out_dtype="]),
        "from_state": (lambda: bitfold.ExactAccumulator.from_state(PLAN, state, turbo=1),
                       ["plan=", "state=", "dtype="]),
        "accumulator.merge": (lambda: acc().merge(acc(), turbo=1), ["other="]),
        "Fold": (lambda: bitfold.Fold([0], 1, turbo=1), ["index=", "K="]),
        "plan.expand": (lambda: PLAN.expand(np.ones(2), turbo=1), ["v="]),
        "segment_sum": (lambda: bitfold.segment_sum(VALS, [0, 1, 1], 2, turbo=1), ["out_dtype="]),
        "add_at": (lambda: bitfold.add_at(np.zeros(2), [0], 1.0, turbo=1), ["indices="]),
        "get_strategy": (lambda: bitfold.get_strategy("exact", turbo=1), ["name="]),
        "digest": (lambda: bitfold.digest(VALS, turbo=1), ["x="]),
        "bits_equal": (lambda: bitfold.bits_equal(VALS, VALS, turbo=1), ["a=", "b="]),
        "record": (lambda: bitfold.record("/nonexistent/run.jsonl", turbo=1), ["background="]),
    }  # fmt: skip


def _torch_calls():
    torch, bt = _torch()
    x, i, s = torch.zeros(3, 2), torch.tensor([0, 2]), torch.ones(2, 2)
    emb, bag = bt.Embedding(3, 2), bt.EmbeddingBag(3, 2)
    layer = bt.FoldedLinear(2, 3, buckets=4)
    return {
        "index_add": (lambda: bt.index_add(x, 0, i, s, turbo=1), ["alpha=", "out="]),
        "scatter_add": (lambda: bt.scatter_add(x, 0, i[:, None].expand(2, 2), s, turbo=1),
                        ["src=", "out="]),
        "segment_sum": (lambda: bt.segment_sum(s, i, 3, turbo=1), ["values=", "K="]),
        "embedding": (lambda: bt.embedding(i, x, turbo=1), ["padding_idx=", "max_norm="]),
        "embedding_bag": (lambda: bt.embedding_bag(i, x, i[:1] * 0, turbo=1), ["mode="]),
        "expand": (lambda: bt.expand(torch.ones(2), PLAN, turbo=1), ["strategy="]),
        "fold": (lambda: bt.fold(torch.ones(3), PLAN, turbo=1), ["out_dtype="]),
        "FoldedLinear()": (lambda: bt.FoldedLinear(2, 3, buckets=4, turbo=1),
                           ["buckets=", "seed="]),
        "FoldedLinear.forward": (lambda: layer(torch.ones(1, 2), turbo=1), ["x="]),
        "Embedding()": (lambda: bt.Embedding(3, 2, turbo=1), ["padding_idx=", "sparse="]),
        "Embedding.forward": (lambda: emb(i, turbo=1), ["input="]),
        "EmbeddingBag()": (lambda: bt.EmbeddingBag(3, 2, turbo=1), ["mode=", "padding_idx="]),
        "EmbeddingBag.forward": (lambda: bag(i[None], turbo=1), ["per_sample_weights="]),
    }  # fmt: skip


def _jax_calls():
    jnp, bj = _jax()
    return {
        "jax.segment_sum": (lambda: bj.segment_sum(jnp.ones(3), jnp.array([0, 1, 1]), 2, turbo=1),
                            ["num_segments=", "mode=", "bucket_size=", "backend="]),
        "jax.expand": (lambda: bj.expand(jnp.ones(2), PLAN, turbo=1), ["strategy=", "backend="]),
        "jax.fold": (lambda: bj.fold(jnp.ones(3), PLAN, turbo=1), ["out_dtype="]),
    }  # fmt: skip


def _distributed_calls():
    torch, _ = _torch()
    from bitfold import distributed

    return {
        "exact_all_reduce": (lambda: distributed.exact_all_reduce(torch.ones(3), turbo=1),
                             ["mean_over=", "timeout="]),
        "GradientSum": (lambda: distributed.GradientSum([torch.ones(3)], turbo=1), ["timeout="]),
    }  # fmt: skip


CALL_SETS = [_engine_calls, _torch_calls, _jax_calls, _distributed_calls]


@pytest.mark.parametrize("calls", CALL_SETS, ids=lambda f: f.__name__.strip("_"))
def test_an_unknown_option_anywhere_is_a_fold_error_listing_the_valid_ones(calls):
    """Python would raise ``TypeError: ... got an unexpected keyword argument``; every public
    call raises a bitfold error (also a TypeError) that names the keyword and lists the valid
    ones, before any work."""
    for name, (call, valid) in calls().items():
        with pytest.raises(bitfold.errors.UnknownOptionError) as info:
            call()
        err = info.value
        assert isinstance(err, bitfold.FoldError) and isinstance(err, TypeError), name
        msg = str(err)
        assert "turbo=" in msg and "valid options: " in msg, (name, msg)
        for word in valid:
            assert word in msg, (name, word, msg)
        one_error(err)


def test_too_many_positional_arguments_are_a_fold_type_error():
    for call, words in [
        (lambda: bitfold.strategies("exact"), "strategies() takes at most 0 positional"),
        (lambda: bitfold.backend_names(1), "backend_names() takes at most 0 positional"),
        (lambda: bitfold.Fold([0], 1, 2), "Fold() takes at most 2 positional arguments (index, K)"),
    ]:
        with pytest.raises(bitfold.FoldTypeError, match=re.escape(words)) as info:
            call()
        one_error(info.value)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"route": "limbs", "carry_every": 1.5}, "carry_every=1.5"),  # it gave a wrong sum
        ({"route": "limbs", "carry_every": 0}, "carry_every=0"),
        ({"route": "limbs", "carry_every": True}, "carry_every=True"),
        ({"route": "float-stream", "kernel": "fast"}, "unknown exact kernel 'fast'"),
        ({"route": "turbo"}, "unknown exact route 'turbo'; choose 'auto' or one of"),
    ],
)
def test_a_bad_option_value_is_refused_before_any_work(options, words):
    """Option values are checked by the call and by ``plan.route`` alike (a negative
    carry_every made the limb kernel loop forever; 1.5 summed every bucket wrongly)."""
    with pytest.raises(bitfold.FoldError, match=re.escape(words)) as info:
        PLAN(VALS, **options)
    one_error(info.value)
    with pytest.raises(bitfold.FoldError, match=re.escape(words)):
        PLAN.route(VALS, **options)
    with pytest.raises(bitfold.FoldError, match="carry_every=-1"):
        PLAN.route(VALS, route="limbs", carry_every=-1)
    acc = PLAN.accumulator(carry_every=2.5)
    with pytest.raises(bitfold.FoldError, match=re.escape("carry_every=2.5")):
        acc.add(VALS)
    assert not acc.state.any()  # nothing was added


def test_the_accumulators_bad_trailing_and_plan_are_named():
    with pytest.raises(bitfold.FoldTypeError, match=r"trailing must be a shape .* 'ab'") as info:
        PLAN.accumulator(trailing="ab")
    one_error(info.value)
    with pytest.raises(bitfold.FoldTypeError, match=r"bitfold\.Fold; got a str"):
        bitfold.ExactAccumulator("plan")
    with pytest.raises(bitfold.FoldTypeError, match=r"two bitfold\.Fold plans; got a int"):
        PLAN.same_map(3)


# -- arrays on a device without data (torch's meta) -----------------------------------------------
def _meta_engine_cases(torch):
    meta = torch.ones(3, device="meta")
    ids = torch.zeros(3, dtype=torch.long, device="meta")
    return [
        ("index", lambda: bitfold.Fold(torch.zeros(5, dtype=torch.long, device="meta"), 3)),
        ("index", lambda: bitfold.segment_sum(torch.ones(3), ids, 2)),
        ("values", lambda: bitfold.segment_sum(meta, [0, 1, 1], 2)),
        ("values", lambda: PLAN(meta)),
        ("values", lambda: PLAN.route(meta)),
        ("values", lambda: PLAN.expand(torch.ones(2, device="meta"))),
        ("values", lambda: PLAN.accumulator().add(meta)),
        ("init", lambda: PLAN(torch.ones(3), init=torch.zeros(2, device="meta"))),
        ("state", lambda: bitfold.ExactAccumulator.from_state(
            PLAN, torch.zeros(2, 15, dtype=torch.long, device="meta"))),
        ("index", lambda: PLAN.same_index(ids)),
        ("the array to digest", lambda: bitfold.digest(meta)),
        ("the array to digest", lambda: bitfold.bits_equal(meta, meta)),
        ("a", lambda: bitfold.add_at(torch.zeros(3, device="meta"), [0], 1.0)),
        ("indices", lambda: bitfold.add_at(torch.zeros(3), ids, 1.0)),
        ("b", lambda: bitfold.add_at(torch.zeros(3), [0, 1, 2], meta)),
    ]  # fmt: skip


def _meta_torch_cases(torch, bt):
    m = {"device": "meta"}
    i, x, s = torch.tensor([0, 2]), torch.zeros(3, 2), torch.ones(2, 2)
    mi = i.to("meta")
    return [
        ("index", lambda: bt.index_add(x, 0, mi, s)),  # it gave uninitialised memory
        ("input", lambda: bt.index_add(x.to("meta"), 0, i, s)),
        ("source", lambda: bt.index_add(x, 0, i, s.to("meta"))),
        ("input", lambda: bt.index_add(torch.zeros(3, dtype=torch.long, **m), 0, i, i)),
        ("index", lambda: bt.scatter_add(x, 0, mi[:, None].expand(2, 2), s)),
        ("src", lambda: bt.scatter_add(x, 0, i[:, None].expand(2, 2), s.to("meta"))),
        ("index", lambda: bt.segment_sum(s, mi, 3)),
        ("values", lambda: bt.segment_sum(s.to("meta"), i, 3)),
        ("values", lambda: bt.segment_sum(torch.ones(2, dtype=torch.long, **m), i, 3)),
        ("input", lambda: bt.embedding(mi, x)),
        ("weight", lambda: bt.embedding(i, x.to("meta"))),
        ("weight", lambda: bt.embedding(i, torch.zeros(3, 2, dtype=torch.long, **m))),
        ("input", lambda: bt.embedding_bag(mi, x, torch.tensor([0]))),
        ("offsets", lambda: bt.embedding_bag(i, x, torch.tensor([0], **m))),
        ("weight", lambda: bt.embedding_bag(i, x.to("meta"), torch.tensor([0]))),
        ("per_sample_weights", lambda: bt.embedding_bag(
            i, x, torch.tensor([0]), mode="sum", per_sample_weights=torch.ones(2, **m))),
        ("input", lambda: bt.Embedding(3, 2)(mi)),
        ("weight", lambda: bt.Embedding(3, 2, device="meta")(i)),
        ("input", lambda: bt.EmbeddingBag(3, 2)(mi[None])),
        ("v", lambda: bt.expand(torch.ones(2, **m), PLAN)),
        ("values", lambda: bt.fold(torch.ones(3, **m), PLAN)),
        ("v", lambda: bt.FoldedLinear(2, 3, buckets=4, device="meta")(torch.ones(1, 2, **m))),
    ]  # fmt: skip


def _meta_distributed_cases(torch):
    from bitfold import distributed

    return [
        ("the tensor to all-reduce",
         lambda: distributed.exact_all_reduce(torch.ones(3, device="meta"))),
        ("parameter 1", lambda: distributed.GradientSum(
            [torch.ones(2), torch.ones(3, device="meta")])),
    ]  # fmt: skip


def test_a_meta_tensor_is_refused_by_name_wherever_a_tensor_enters():
    """A meta tensor has a shape and no data. Reading it raised torch's NotImplementedError
    ("Cannot copy out of meta tensor"), and a meta index with CPU tensors made the drop-ins run
    their shape-only implementations and return uninitialised memory. Every entry point now
    refuses it by name, before any work, with one DeviceError."""
    torch, bt = _torch()
    cases = _meta_engine_cases(torch) + _meta_torch_cases(torch, bt)
    cases += _meta_distributed_cases(torch)
    for what, call in cases:
        with pytest.raises(bitfold.DeviceError) as info:
            call()
        msg = str(info.value)
        assert msg.startswith(f"{what} is a torch.") and "'meta' device" in msg, (what, msg)
        assert "holds shapes but no data" in msg and ".to('cpu')" in msg
        one_error(info.value)


# -- arrays of another library ------------------------------------------------------------------
def test_an_array_of_another_library_is_refused_naming_what_was_given_and_what_is_taken():
    """A torch tensor into bitfold.jax raised ``TypeError: Cannot interpret 'torch.float32' as a
    data type``; a JAX array into bitfold.torch named only 'ArrayImpl'."""
    torch, bt = _torch()
    jnp, bj = _jax()
    t, j, ids = torch.ones(3), jnp.ones(3), jnp.array([0, 1, 1])
    cases = [
        (lambda: bj.segment_sum(t, ids, 2), "data must be a JAX array", "torch.Tensor"),
        (lambda: bj.segment_sum(j, torch.tensor([0, 1, 1]), 2), "segment_ids must be a JAX array",
         "torch.Tensor"),
        (lambda: bj.expand(torch.ones(2), PLAN), "v must be a JAX array", "torch.Tensor"),
        (lambda: bj.fold(t, PLAN), "values must be a JAX array", "torch.Tensor"),
        (lambda: bj.segment_sum([1.0, 2.0], [0, 1], 2), "data must be a JAX array", "list"),
        (lambda: bt.index_add(j, 0, torch.tensor([0]), t), "input must be a torch.Tensor",
         "jax.Array"),
        (lambda: bt.segment_sum(j, torch.tensor([0, 1, 1]), 2), "values must be a torch.Tensor",
         "jax.Array"),
        (lambda: bt.embedding(ids, torch.ones(2, 2)), "input must be a torch.Tensor", "jax.Array"),
        (lambda: bt.fold(j, PLAN), "values must be a torch.Tensor", "jax.Array"),
        (lambda: bt.expand(jnp.ones(2), PLAN), "v must be a torch.Tensor", "jax.Array"),
        (lambda: bt.FoldedLinear(2, 3, buckets=4)(jnp.ones((1, 2))), "takes a torch.Tensor",
         "jax.Array"),
        (lambda: bitfold.add_at(jnp.zeros(3), [0], 1.0), "a NumPy or CuPy array or a torch",
         "jax.Array"),
    ]  # fmt: skip
    for call, taken, given in cases:
        with pytest.raises(bitfold.FoldTypeError) as info:
            call()
        msg = str(info.value)
        assert taken in msg and given in msg, msg
        one_error(info.value)


# -- a parameter is named as the user wrote it ----------------------------------------------------
def test_errors_name_each_parameter_as_the_caller_wrote_it():
    """The user passed num_segments, buckets, a table or an input tensor, never a ``K``."""
    torch, bt = _torch()
    jnp, bj = _jax()
    x = jnp.ones(3)
    cases = [
        (lambda: bj.segment_sum(x, jnp.array([0, 1, 1]), 0), bitfold.FoldError,
         "num_segments must be a positive integer (num_segments >= 1); got num_segments = 0"),
        (lambda: bj.segment_sum(jnp.ones(0), jnp.zeros(0, jnp.int32)), bitfold.FoldError,
         "num_segments was not given and segment_ids hold no id >= 0"),
        (lambda: bj.segment_sum(x, jnp.array([0, 2, 1]), 2), bitfold.IndexRangeError,
         "segment_ids[1] = 2 (flat position 1) is out of range: every entry of segment_ids must "
         "satisfy 0 <= segment_ids < num_segments = 2"),
        (lambda: bt.FoldedLinear(4, 4, buckets=0), bitfold.FoldError,
         "buckets must be a positive integer (buckets >= 1); got buckets = 0"),
        (lambda: bt.FoldedLinear(4, 4, buckets="8"), bitfold.FoldTypeError,
         "buckets must be a positive integer; got '8'"),
        (lambda: bt.embedding(torch.tensor([0, 5]), torch.ones(5, 2)), bitfold.IndexRangeError,
         "every entry of input must satisfy 0 <= input < weight.shape[0] = 5"),
        (lambda: bt.embedding_bag(torch.tensor([7]), torch.ones(5, 2), torch.tensor([0])),
         bitfold.IndexRangeError, "input[0] = 7 (flat position 0)"),
        (lambda: bt.scatter_add(torch.zeros(4, 2), 0, torch.tensor([[1, 0], [0, 9]]),
                                torch.ones(2, 2)),
         bitfold.IndexRangeError, "index[1, 1] = 9 (flat position 3) is out of range: every "
         "entry of index must satisfy 0 <= index < input.shape[0] = 4"),
        (lambda: bt.index_add(torch.zeros(3), 0, torch.tensor([0]), torch.ones(1), alpha="2"),
         bitfold.FoldTypeError, "alpha must be a real number"),
        (lambda: bt.index_add(torch.zeros(3), "0", torch.tensor([0]), torch.ones(1)),
         bitfold.FoldTypeError, "dim must be an integer; got '0'"),
        (lambda: bt.embedding(torch.tensor([0]), torch.ones(3, 2), padding_idx="0"),
         bitfold.FoldTypeError, "padding_idx must be an integer or None"),
        (lambda: bt.Embedding(-1, 2), bitfold.FoldError, "num_embeddings must be an integer >= 0"),
        (lambda: bitfold.add_at(np.zeros(3), [0, 3], 1.0), bitfold.IndexRangeError,
         "-3 <= indices < len(a) = 3"),
        (lambda: bitfold.add_at(np.zeros(3), [0.5], 1.0), bitfold.FoldTypeError,
         "indices must be an array of integers"),
    ]  # fmt: skip
    for call, error, words in cases:
        with pytest.raises(error) as info:
            call()
        msg = str(info.value)
        assert words in msg, msg
        assert not re.search(r"\bK\b", msg), msg
        one_error(info.value)


# -- NaN, infinities and overflow are IEEE results, never NumPy warnings ---------------------------
@pytest.mark.parametrize("strategy", bitfold.strategies())
@pytest.mark.parametrize(
    ("values", "out_dtype", "want"),
    [
        (np.array([np.nan, 1.0, 2.0], np.float32), None, "nan"),
        (np.array([np.inf, -np.inf, 1.0], np.float32), None, "nan"),
        (np.array([3e38, 3e38, 3e38], np.float32), None, "inf"),
        (np.array([1e300, 1e300, -1.0]), "float32", "inf"),
        (np.array([6e4, 6e4, 1.0], np.float16), "float16", "inf"),
        (np.array([1e300, -1e300, np.nan]), "float16", "nan"),
    ],
)
def test_no_numpy_warning_leaks_from_any_strategy(strategy, values, out_dtype, want):
    """``atomic`` on NaN input let NumPy's RuntimeWarning ("invalid value encountered in add")
    leak from the host backend; overflow and casts warned too. The results follow IEEE."""
    plan = bitfold.Fold(np.zeros(3, np.int64), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = plan(values, strategy, out_dtype=out_dtype)
        init = np.zeros(1, got.dtype)
        with_init = plan(values, strategy, out_dtype=out_dtype, init=init)
    for result in (got, with_init):
        assert np.isnan(result[0]) if want == "nan" else result[0] == np.inf


# -- distributed: the arguments are checked before any collective ---------------------------------
@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"mean_over": 0}, "mean_over=0"),  # GradientSum read 0 as 1
        ({"mean_over": 2.5}, "mean_over=2.5"),  # and 2.5 as 2
        ({"mean_over": True}, "mean_over=True"),
        ({"timeout": "300"}, "timeout='300'"),
        ({"timeout": 0}, "timeout=0"),
    ],
)
def test_exact_all_reduce_checks_its_arguments_before_any_collective(options, words):
    """No process group exists here: reaching a collective would raise torch's own error."""
    torch, _ = _torch()
    from bitfold import distributed

    assert not distributed.dist.is_initialized()
    with pytest.raises(bitfold.FoldError, match=re.escape(words)) as info:
        distributed.exact_all_reduce(torch.ones(3), **options)
    one_error(info.value)


def test_gradient_sum_checks_mean_over_and_timeout_before_any_collective(monkeypatch):
    torch, _ = _torch()
    from bitfold import distributed

    with pytest.raises(bitfold.FoldError, match=re.escape("timeout=-1")):
        distributed.GradientSum([torch.ones(2)], timeout=-1)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    grads = distributed.GradientSum([torch.ones(2)])
    for bad in (0, -2, 1.5):
        with pytest.raises(bitfold.FoldError, match=re.escape(f"mean_over={bad!r}")) as info:
            grads.reduce(mean_over=bad)
        one_error(info.value)
    with pytest.raises(bitfold.errors.UnknownOptionError, match="group=, mean_over="):
        grads.reduce(mean=4)
