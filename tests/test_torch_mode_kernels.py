"""``exact_mode()`` runs Python only for the fold ops: the other ops of a model never enter it.

The mode gives the rules' fold ops kernels of their own (at the BackendSelect key) and pushes no
dispatch mode and no function mode, so a model's other ops run as in plain PyTorch. These tests
count the calls of those kernels, so that a change that sends every op through Python again
(a dispatch mode, a function mode) fails here; and check the ways the kernels must keep working:
no_grad, inference mode, autocast, autograd's backward, threads, nesting.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

from torch.overrides import _get_current_function_mode_stack  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack  # noqa: E402

import bitfold.torch as bt  # noqa: E402
from bitfold.torch import mode as mode_module  # noqa: E402


def _calls() -> int:
    return mode_module._kernels["calls"]


@pytest.fixture(autouse=True)
def no_sparse_tensor_yet(monkeypatch):
    """Each test starts as a process that has made no sparse tensor (another test file's, in
    the same worker, would make every mode start full)."""
    monkeypatch.setitem(mode_module._kernels, "sparse_seen", False)


class Net(torch.nn.Module):
    """An embedding, a linear layer, a nonlinearity and a scatter-add: one fold each way."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(20, 8)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.lin(self.emb(ids))) * 2 + 1
        out = torch.zeros(4, 8).index_add(0, dst, h)  # forward fold: index_add
        return out.square().mean()  # backward folds: embedding_dense_backward


IDS = torch.tensor([1, 3, 3, 7, 1, 1])
DST = torch.tensor([0, 1, 1, 3, 0, 2])


def test_only_the_fold_ops_of_a_step_enter_python():
    net = Net()
    with bt.exact_mode() as mode:
        assert not _get_current_dispatch_mode_stack()  # no dispatch mode: no op goes to Python
        assert not _get_current_function_mode_stack()  # nor any torch function
        before = _calls()
        net(IDS, DST).backward()
        seen = _calls() - before
    assert mode.counts == {"index_add": 1, "embedding_dense_backward": 1}
    assert seen == 2, seen  # the two folds, and not one of the step's dozens of other ops
    with bt.exact_mode():
        before = _calls()
        x = torch.randn(50, 8, requires_grad=True)
        (x.tanh() @ x.t()).relu().sum().backward()  # no fold at all
        assert _calls() == before


def test_the_kernels_see_folds_under_no_grad_inference_mode_and_autocast():
    src, dst = torch.ones(6, 3), DST
    with bt.exact_mode() as mode:
        with torch.no_grad():
            torch.zeros(4, 3).index_add_(0, dst, src)
        with torch.inference_mode():  # ADInplaceOrView and autograd's keys are skipped here
            torch.zeros(4, 3).index_add(0, dst, src)
        net = Net()
        with torch.autocast("cpu", dtype=torch.bfloat16):  # linear in bfloat16
            net.lin(net.emb(IDS)).float().square().sum().backward()
    assert mode.counts == {"index_add": 2, "embedding_dense_backward": 1}


def test_a_mode_is_its_threads_own_and_the_innermost_counts():
    src, dst = torch.ones(6, 3), DST
    other: list[dict[str, int]] = []
    with bt.exact_mode() as outer:
        worker = threading.Thread(
            target=lambda: other.append(dict(_index_add_under_a_mode(src, dst)))
        )
        worker.start()
        torch.zeros(4, 3).index_add(0, dst, src)  # this thread's mode: outer
        with bt.exact_mode() as inner:
            torch.zeros(4, 3).index_add(0, dst, src)
        worker.join()
    torch.zeros(4, 3).index_add(0, dst, src)  # outside any mode: ATen's kernel, uncounted
    assert outer.counts == {"index_add": 1} and inner.counts == {"index_add": 1}
    assert other == [{"index_add": 2}]  # the worker's own mode; the outer one saw none of it


def _index_add_under_a_mode(src, dst):
    torch.zeros(4, 3).index_add(0, dst, src)  # no mode on this thread: left as it is
    with bt.exact_mode() as mode:
        torch.zeros(4, 3).index_add(0, dst, src)
        w = torch.zeros(4, 3, requires_grad=True)
        w.index_add(0, dst, src).sum().backward()
    return mode.counts


def test_a_sparse_tensor_turns_the_mode_full():
    """Sparse products need the function layer (their sparse factor's gradient): the mode turns
    into a dispatch mode at the first sparse tensor it sees, until it exits."""
    i = torch.tensor([[0, 1, 1], [1, 0, 2]])
    with bt.exact_mode() as mode:
        assert not mode._entries[-1][1]
        A = torch.sparse_coo_tensor(i, torch.ones(3), (2, 3))
        assert mode._entries[-1][1] and mode in _get_current_dispatch_mode_stack()
        (A @ torch.ones(3, 2)).sum()
    assert mode.counts["sparse_mm"] == 1
    assert not _get_current_dispatch_mode_stack() and not _get_current_function_mode_stack()
    with bt.exact_mode(full=False) as fast:
        torch.sparse_coo_tensor(i, torch.ones(3), (2, 3))
        assert not _get_current_dispatch_mode_stack()
    assert not fast.counts


CSR_ROW = "torch.sparse_csr_tensor(torch.tensor([0, 3, 3]), torch.tensor([0, 1, 2]), " \
    "torch.tensor([1e8, 1.0, -1e8]), (2, 3))"


def test_a_sparse_tensor_made_outside_the_mode_makes_the_next_mode_full():
    """A CSR matrix from a conversion (built inside ATen, no constructor's kernel) times a
    vector or a matrix reaches no fold kernel: the mode must start full to see it."""
    A = torch.tensor([[1e8, 1.0, -1e8], [0.0, 0.0, 0.0]]).to_sparse_csr()
    assert mode_module._kernels["sparse_seen"]
    for product in (lambda: A @ torch.ones(3), lambda: torch.matmul(A, torch.ones(3, 1))):
        with bt.exact_mode(strict=True) as mode:
            assert mode in _get_current_dispatch_mode_stack()
            y = product()
        assert y.flatten().tolist() == [1.0, 0.0] and mode.counts == {"sparse_mm": 1}


def test_a_sparse_tensor_made_before_the_import_is_found():
    import subprocess
    import sys

    code = (f"import torch\nA = {CSR_ROW}\nimport bitfold.torch as bt\n"
            "with bt.exact_mode() as m:\n    y = A @ torch.ones(3, 1)\n"
            "print(y.flatten().tolist(), dict(m.counts))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[1.0, 0.0] {'sparse_mm': 1}", done.stdout


def test_code_compiled_outside_the_mode_does_not_run_inside_it():
    """Dynamo's cached code (its kernels unseen by the mode) runs eagerly inside the mode."""
    ran = []

    def backend(gm, example_inputs):
        def compiled(*args):
            ran.append(1)
            return gm(*args)

        return compiled

    torch._dynamo.reset()
    f = torch.compile(lambda s: torch.zeros(4, 3).index_add(0, DST, s) * 2, backend=backend)
    f(torch.ones(6, 3))
    assert ran == [1]
    with bt.exact_mode() as mode:
        f(torch.ones(6, 3))
    assert ran == [1] and mode.counts == {"index_add": 1}
    torch._dynamo.reset()
