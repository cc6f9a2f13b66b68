"""Exact sparse @ dense products: folds of exact products keyed by the sparse structure.

A product with a sparse matrix ``A`` (COO, CSR or CSC, 2-D, scalar values)
is a fold: ``(A @ X)[i, :]`` adds the rows ``a * X[k, :]`` of the stored
entries ``(i, k, a)`` of row i. The terms of each output element are folded
exactly (:func:`bitfold.torch.folds.fold_rows`, keyed by the entries' rows)
and rounded once to the dtype.

**One rule for sums of products**, the same on every path a sum of products
takes (``w * x[src]`` then ``index_add``, ``torch_sparse``'s ``spmm``, an
embedding bag's ``per_sample_weights``): each product ``a * x`` is the
product **rounded to the dtype, as torch computes it**, and the sum of those
rounded products is rounded once. So a graph layer gives the same bits
whether its messages go through an ``edge_index``, a ``SparseTensor`` or a
``torch.sparse`` matrix. The exact dot product (each product exact, the sum
rounded once: more accurate, other bits) is there by name:
``exact_mode(products="exact")`` (:data:`PRODUCTS`). Numeric contract:

* ``A @ X`` (``mm``, ``matmul``, ``torch.sparse.mm``; ``A`` on the left or
  the right): each element is the **correctly rounded sum of the products**
  ``a * x`` of its terms (an empty row gives ``+0.0``).
* ``addmm(C, A, X, beta=beta, alpha=alpha)``: ``beta`` and ``alpha`` are
  first rounded to the dtype (torch's kernels read them so); then each
  element is the correctly rounded value of ``beta * C + alpha * sum(a * x)``,
  one rounding. ``beta == 0`` ignores ``C`` (NaN included), as torch does.
* the gradient of ``X``: ``alpha * A^T @ G``, the same way (a fold keyed by
  the entries' columns); the gradient of the sparse values: each entry
  ``(i, k)`` gets the correctly rounded ``alpha * sum_j G[i, j] * X[k, j]``
  (a sampled product, a fold of N products into each entry), in ``A``'s
  layout; a COO ``A`` with repeated coordinates gives each of them its
  coordinate's value, as torch does. The gradient of ``C`` is ``beta * G``.
* ``torch.sparse.mm(A, X, "mean")``: the exact sum divided once by the
  number of entries in the row (rows without entries give 0).
* ``sparse_sampled_addmm``: each stored value becomes the correctly rounded
  ``beta * value + alpha * sum_j mat1[i, j] * mat2[j, k]``.

With ``products="exact"``: exact for float16, bfloat16 and float32 always;
for float64 unless a product leaves float64's range
(:mod:`bitfold.torch.products`). The terms take ``nnz * N`` float64 values
each (1 to 4 terms a product; 1 or 2 with rounded products): memory, not
time, is the cost to watch.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass
from typing import Any

import torch

from .devices import folds_on
from .folds import fold_rows
from .products import as_dtype, product_terms, scale_terms

#: the sparse layouts folded here
LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)

#: the product rules: each product rounded to the dtype as torch rounds it (the default, every
#: path's rule), or exact (the exact dot product)
PRODUCT_RULES = ("rounded", "exact")
#: the rule in force (set by ``exact_mode(products=...)`` while the mode is active)
PRODUCTS: contextvars.ContextVar[str] = contextvars.ContextVar("bitfold_products",
                                                               default="rounded")


def _terms(a: torch.Tensor, b: torch.Tensor, scale: float, rule: str) -> list[torch.Tensor]:
    """Float64 terms whose exact sum is ``scale`` times the products ``a * b`` (broadcasting):
    each product rounded to the dtype (``rule="rounded"``) or exact (``"exact"``)."""
    if rule == "exact":
        return product_terms(a, b, scale)
    return scale_terms([(a * b).to(torch.float64)], scale)


@dataclass(frozen=True)
class Pattern:
    """A 2-D sparse matrix as its stored entries: ``rows[e], cols[e], values[e]``."""

    rows: torch.Tensor
    cols: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, int]

    def t(self) -> Pattern:
        """The transposed matrix (the same entries, rows and columns swapped)."""
        return Pattern(self.cols, self.rows, self.values, (self.shape[1], self.shape[0]))


def problem(A: torch.Tensor) -> str | None:
    """Why ``A`` cannot be read as a :class:`Pattern` (None when it can)."""
    if A.layout not in LAYOUTS:
        return f"a {A.layout} matrix: bitfold folds COO, CSR and CSC products"
    if A.dim() != 2:
        return f"a {A.dim()}-D sparse tensor: bitfold folds 2-D sparse matrices"
    if A.layout == torch.sparse_coo and A.dense_dim() != 0:
        return "a hybrid COO tensor (dense values): bitfold folds scalar entries"
    if A.layout != torch.sparse_coo and A.values().dim() != 1:
        return "a hybrid compressed tensor (dense values): bitfold folds scalar entries"
    return None


def _expand_pointers(pointers: torch.Tensor, n: int) -> torch.Tensor:
    """Compressed pointers (n + 1) to the outer index of each stored entry."""
    outer = torch.arange(n, device=pointers.device, dtype=torch.int64)
    return torch.repeat_interleave(outer, pointers.to(torch.int64).diff())


def pattern(A: torch.Tensor) -> Pattern:
    """The stored entries of a COO, CSR or CSC matrix (values detached), in storage order."""
    A = A.detach()
    m, k = int(A.shape[0]), int(A.shape[1])
    if A.layout == torch.sparse_coo:
        idx = A._indices().to(torch.int64)
        return Pattern(idx[0], idx[1], A._values(), (m, k))
    if A.layout == torch.sparse_csr:
        rows = _expand_pointers(A.crow_indices(), m)
        return Pattern(rows, A.col_indices().to(torch.int64), A.values(), (m, k))
    cols = _expand_pointers(A.ccol_indices(), k)
    return Pattern(A.row_indices().to(torch.int64), cols, A.values(), (m, k))


# -- the folds ------------------------------------------------------------------------------------
def spmm(
    p: Pattern,
    X: torch.Tensor,
    *,
    alpha: float = 1.0,
    C: torch.Tensor | None = None,
    beta: float = 1.0,
    products: str | None = None,
) -> torch.Tensor:
    """``beta * C + alpha * (A @ X)`` for ``A`` given by ``p``, exact (module docstring).

    ``X`` is dense ``(K, N)``; ``C`` (optional) broadcasts to ``(M, N)``;
    ``alpha``/``beta`` are rounded to ``X``'s dtype here. The result is
    ``(M, N)`` in ``X``'s dtype. ``products``: a rule of :data:`PRODUCT_RULES`
    (default: the one in force, :data:`PRODUCTS`).
    """
    dtype = X.dtype
    m, n = p.shape[0], int(X.shape[1])
    X = X.detach()
    alpha, beta = as_dtype(alpha, dtype), as_dtype(beta, dtype)
    rule = products or PRODUCTS.get()
    terms = _terms(p.values.detach().reshape(-1, 1), X[p.cols], alpha, rule)
    ids = [p.rows] * len(terms)
    if C is not None and beta != 0:
        base = scale_terms([C.detach().to(torch.float64).broadcast_to((m, n))], beta)
        terms += base
        ids += [torch.arange(m, device=X.device)] * len(base)
    if m == 0 or n == 0:
        return X.new_zeros((m, n))
    return fold_rows(torch.cat(ids), torch.cat(terms), m, out_dtype=dtype)


def sampled(
    p: Pattern,
    G: torch.Tensor,
    X: torch.Tensor,
    *,
    alpha: float = 1.0,
    products: str | None = None,
) -> torch.Tensor:
    """Entry e: ``alpha * sum_j G[rows[e], j] * X[cols[e], j]``, correctly rounded; (nnz,).

    The gradient of the sparse values of ``A @ X`` (``G`` the output
    gradient, ``(M, N)``; ``X`` ``(K, N)``), in ``G``'s dtype; each product
    by ``products`` (:func:`spmm`).
    """
    dtype = G.dtype
    nnz, n = int(p.rows.numel()), int(G.shape[1])
    if nnz == 0:
        return G.new_zeros((0,))
    rule = products or PRODUCTS.get()
    terms = _terms(G.detach()[p.rows], X.detach()[p.cols], as_dtype(alpha, dtype), rule)
    ids = torch.arange(nnz, device=G.device).repeat_interleave(n)
    values = torch.cat([t.reshape(-1) for t in terms])
    return fold_rows(ids.repeat(len(terms)), values, nnz, out_dtype=dtype)


def sparse_grad(
    A: torch.Tensor,
    G: torch.Tensor,
    X: torch.Tensor,
    alpha: float,
    right: bool,
    products: str | None = None,
) -> torch.Tensor:
    """The gradient of ``A`` in ``alpha * (A @ X)`` (or ``X @ A`` with ``right``), in its layout.

    Each stored entry gets the sampled product (:func:`sampled`). A COO
    matrix gets one entry a coordinate (coalesced), so that autograd hands
    every repeat of a coordinate that coordinate's value, as torch does.
    """
    p = pattern(A)
    if A.layout == torch.sparse_coo:
        ncols = max(p.shape[1], 1)
        coords = torch.unique(p.rows * ncols + p.cols)
        p = Pattern(coords // ncols, coords % ncols, p.values, p.shape)
    lp, lg, lx = (p.t(), G.t(), X.t()) if right else (p, G, X)
    values = sampled(lp, lg, lx, alpha=alpha, products=products)
    if A.layout == torch.sparse_coo:
        index = torch.stack([p.rows, p.cols])
        return torch.sparse_coo_tensor(index, values, A.shape, is_coalesced=True)
    if A.layout == torch.sparse_csr:
        return torch.sparse_csr_tensor(A.crow_indices(), A.col_indices(), values, A.shape)
    return torch.sparse_csc_tensor(A.ccol_indices(), A.row_indices(), values, A.shape)


class SparseAddmm(torch.autograd.Function):
    """``beta * C + alpha * (A @ X)`` (or ``X @ A`` with ``right``), exact forward and backward.

    ``A`` is sparse (COO, CSR, CSC); ``X`` dense; ``C`` dense, already of
    the output's shape, or None.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        C: torch.Tensor | None,
        A: torch.Tensor,
        X: torch.Tensor,
        beta: float,
        alpha: float,
        right: bool,
    ) -> torch.Tensor:
        p = pattern(A)
        ctx.beta, ctx.alpha, ctx.right = beta, alpha, right
        ctx.products = rule = PRODUCTS.get()  # the backward's products follow the forward's rule
        ctx.save_for_backward(A, X)
        if right:  # X @ A == (A^T @ X^T)^T
            Ct = None if C is None else C.t()
            return spmm(p.t(), X.t(), alpha=alpha, C=Ct, beta=beta, products=rule).t().contiguous()
        return spmm(p, X, alpha=alpha, C=C, beta=beta, products=rule)

    @staticmethod
    def backward(ctx: Any, G: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        A, X = ctx.saved_tensors
        p = pattern(A)
        grad_c = grad_a = grad_x = None
        if ctx.needs_input_grad[0]:
            grad_c = G if ctx.beta == 1 else G * ctx.beta
        if ctx.needs_input_grad[2]:
            if ctx.right:  # out^T = A^T X^T: dX^T = A @ G^T
                grad_x = spmm(p, G.t(), alpha=ctx.alpha, products=ctx.products).t().contiguous()
            else:
                grad_x = spmm(p.t(), G, alpha=ctx.alpha, products=ctx.products)
        if ctx.needs_input_grad[1]:
            grad_a = sparse_grad(A, G, X, ctx.alpha, ctx.right, ctx.products)
        return grad_c, grad_a, grad_x, None, None, None


def coalesce(A: torch.Tensor) -> torch.Tensor:
    """``A.coalesce()`` for a COO tensor, exact: each coordinate's value the correctly rounded sum.

    The values at a repeated coordinate are folded exactly (one rounding, in
    the values' dtype; hybrid tensors fold their dense rows element by
    element); the coordinates come out sorted, as torch sorts them.
    """
    indices, values = A._indices().to(torch.int64), A._values().detach()
    sizes = [int(s) for s in A.shape[: A.sparse_dim()]]
    coords, inverse = torch.unique(_linear(indices, sizes), sorted=True, return_inverse=True)
    if coords.numel():
        summed = fold_rows(inverse, values, int(coords.numel()))
    else:
        summed = values.new_zeros((0, *values.shape[1:]))
    unravelled = []
    for size in reversed(sizes):
        unravelled.append(coords % size)
        coords = coords // size
    index = torch.stack(unravelled[::-1]) if unravelled else indices[:, :0]
    return torch.sparse_coo_tensor(index, summed, A.shape, is_coalesced=True)


def _linear(indices: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Each column of ``indices`` (one row a dim of ``sizes``) as one row-major number."""
    linear = torch.zeros(indices.shape[1], dtype=torch.int64, device=indices.device)
    for d, size in enumerate(sizes):
        linear = linear * size + indices[d]
    return linear


def sparse_sum(A: torch.Tensor, dims: list[int], dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.sparse.sum(A, dims)`` of a COO tensor, exact.

    Each output element is the correctly rounded sum of the stored values
    (repeated coordinates included; dense elements of a hybrid tensor along
    the summed dense dims too) whose remaining coordinates are its own, one
    rounding in the values' dtype (``dtype``: the values are converted first).
    As torch: summing every sparse dim gives a dense tensor, otherwise a
    coalesced COO tensor of the remaining dims.
    """
    S = A.sparse_dim()
    dims = sorted({d % A.dim() for d in dims})
    values = A._values().detach()
    if dtype is not None:
        values = values.to(dtype)
    dense_summed = [d - S + 1 for d in dims if d >= S]
    dense_kept = [d for d in range(1, values.dim()) if d not in dense_summed]
    values = values.permute(0, *dense_summed, *dense_kept)  # each entry's terms, then the rest
    terms_each = math.prod(values.shape[1 : 1 + len(dense_summed)])
    values = values.reshape((-1, *values.shape[1 + len(dense_summed) :]))
    indices = A._indices().to(torch.int64)
    kept = [d for d in range(S) if d not in dims]
    key = _linear(indices[kept], [int(A.shape[d]) for d in kept])
    key = key.repeat_interleave(terms_each)
    rest = values.shape[1:]
    if not kept:
        if key.numel() == 0:
            return values.new_zeros(rest)
        return fold_rows(key, values, 1)[0]
    coords, inverse = torch.unique(key, sorted=True, return_inverse=True)
    summed = fold_rows(inverse, values, int(coords.numel())) if coords.numel() else (
        values.new_zeros((0, *rest)))  # fmt: skip
    unravelled = []
    for size in reversed([int(A.shape[d]) for d in kept]):
        unravelled.append(coords % size)
        coords = coords // size
    shape = [int(A.shape[d]) for d in kept] + list(rest)
    return torch.sparse_coo_tensor(torch.stack(unravelled[::-1]), summed, shape,
                                   is_coalesced=True)  # fmt: skip


# -- which calls are sparse products --------------------------------------------------------------
def is_sparse(t: Any) -> bool:
    """True for a tensor of any sparse layout (COO, CSR, CSC, BSR, BSC)."""
    return isinstance(t, torch.Tensor) and t.layout != torch.strided


@dataclass(frozen=True)
class Operands:
    """A product that can be made exact: ``beta * C + alpha * (A @ X)`` (``X @ A`` if right)."""

    A: torch.Tensor
    X: torch.Tensor
    right: bool


def operands(a: Any, b: Any, C: Any = None) -> Operands | str | None:
    """How to fold ``a @ b`` (plus ``C``): :class:`Operands`, a reason it stays inexact, or None.

    None: not a sparse product of reals (no sparse operand, integer or bool
    dtypes, shapes torch refuses): leave it to torch. A string: a sparse
    product this module does not fold (sparse @ sparse, BSR, hybrid or
    batched sparse tensors, complex values, other devices).
    """
    if not (is_sparse(a) or is_sparse(b)) or is_sparse(C):
        return None
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return None
    if is_sparse(a) and is_sparse(b):
        return "sparse @ sparse: a sparse result, summed by torch"
    A, X, right = (a, b, False) if is_sparse(a) else (b, a, True)
    if A.dtype != X.dtype or (C is not None and C.dtype != X.dtype):
        return None  # torch refuses mixed dtypes
    if not A.dtype.is_floating_point:
        return None if not A.dtype.is_complex else "complex values: bitfold folds reals"
    if A.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return f"{A.dtype}: bitfold folds float16 .. float64"
    why = problem(A)
    if why is not None:
        return why
    for t in (A, X, C):
        if isinstance(t, torch.Tensor) and not folds_on(t.device):
            return f"a tensor on {t.device}: no bitfold backend folds tensors there"
    if X.dim() != 2 or X.shape[1 if right else 0] != A.shape[0 if right else 1]:
        return None  # torch raises its own error (or a batched product: not folded here)
    return Operands(A, X, right)


def product(
    ops: Operands, C: torch.Tensor | None = None, beta: float = 1.0, alpha: float = 1.0
) -> torch.Tensor:
    """``beta * C + alpha * (A @ X)`` (``X @ A`` if right), exact, without autograd."""
    p = pattern(ops.A)
    if ops.right:
        m, n = int(ops.X.shape[0]), int(ops.A.shape[1])
        Ct = None if C is None else C.broadcast_to((m, n)).t()
        return spmm(p.t(), ops.X.t(), alpha=alpha, C=Ct, beta=beta).t().contiguous()
    return spmm(p, ops.X, alpha=alpha, C=C, beta=beta)


def differentiable_product(
    ops: Operands, C: torch.Tensor | None = None, beta: float = 1.0, alpha: float = 1.0
) -> torch.Tensor:
    """As :func:`product`, differentiable in ``C``, ``A`` (its values) and ``X``: exact backward."""
    if C is not None:
        m = ops.X.shape[0] if ops.right else ops.A.shape[0]
        n = ops.A.shape[1] if ops.right else ops.X.shape[1]
        C = C.expand(int(m), int(n))  # a broadcast C's gradient is summed by autograd
    out = SparseAddmm.apply(C, ops.A, ops.X, float(beta), float(alpha), ops.right)
    return out


def row_counts(A: torch.Tensor) -> torch.Tensor:
    """The number of stored entries in each row of ``A`` (what ``reduce="mean"`` divides by)."""
    p = pattern(A)
    counts = torch.zeros(p.shape[0], dtype=torch.int64, device=p.rows.device)
    return counts.index_add_(0, p.rows, torch.ones_like(p.rows))


def sampled_addmm(
    S: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, beta: float, alpha: float
) -> torch.Tensor:
    """``torch.sparse.sampled_addmm`` (CSR ``S``), exact: module docstring."""
    p = pattern(S)
    dtype = S.dtype
    terms = _terms(mat1.detach()[p.rows], mat2.detach().t()[p.cols], as_dtype(alpha, dtype),
                   PRODUCTS.get())  # fmt: skip
    n = int(mat1.shape[1])
    nnz = int(p.rows.numel())
    ids = torch.arange(nnz, device=S.device).repeat_interleave(n).repeat(len(terms))
    values = [t.reshape(-1) for t in terms]
    beta = as_dtype(beta, dtype)
    if beta != 0:
        base = scale_terms([p.values.detach().to(torch.float64)], beta)
        values += base
        ids = torch.cat([ids, *[torch.arange(nnz, device=S.device)] * len(base)])
    summed = (
        fold_rows(ids, torch.cat(values), nnz, out_dtype=dtype) if nnz else p.values.new_zeros(0)
    )
    return torch.sparse_csr_tensor(S.crow_indices(), S.col_indices(), summed, S.shape)


__all__ = [
    "LAYOUTS",
    "PRODUCTS",
    "PRODUCT_RULES",
    "Operands",
    "Pattern",
    "SparseAddmm",
    "coalesce",
    "differentiable_product",
    "is_sparse",
    "operands",
    "pattern",
    "problem",
    "product",
    "row_counts",
    "sampled",
    "sampled_addmm",
    "sparse_grad",
    "spmm",
]
