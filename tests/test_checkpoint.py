"""Checkpoint digests (bitfold.repro.checkpoint) and ``bitfold digest``."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bitfold
from bitfold import cli
from bitfold.errors import FoldError
from bitfold.repro.checkpoint import checkpoint_digest, combine, read_checkpoint

# NumPy dtype -> safetensors dtype code
ST_CODES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32",
    "int64": "I64", "float16": "F16", "float32": "F32", "float64": "F64",
}


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    w = {
        "fc1.weight": rng.standard_normal((6, 5)).astype(np.float32),
        "fc1.bias": np.array([-0.0, 0.0, np.nan, np.inf, 1e-45], np.float32),  # bits matter
        "fc2.weight": rng.standard_normal((2, 6)).astype(np.float64),
        "emb": rng.standard_normal((3, 2)).astype(np.float16),
        "step": np.array(7, np.int64),  # 0-d
        "mask": rng.random(4) < 0.5,
        "codes": rng.integers(-128, 127, size=(2, 2), dtype=np.int8),
        "u8": rng.integers(0, 255, size=3, dtype=np.uint8),
        "i16": np.arange(3, dtype=np.int16),
        "i32": np.arange(4, dtype=np.int32).reshape(2, 2),
        "empty": np.zeros((0, 3), np.float32),
    }
    return w


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]],
                      metadata: dict[str, str] | None = None) -> Path:
    """A minimal safetensors writer: name -> (dtype code, shape, little-endian bytes)."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    data = b""
    for name, (code, shape, raw) in tensors.items():
        header[name] = {"dtype": code, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def _st_from_numpy(path: Path, w: dict[str, np.ndarray]) -> Path:
    return write_safetensors(path, {
        n: (ST_CODES[str(a.dtype)], a.shape, a.astype(a.dtype.newbyteorder("<")).tobytes())
        for n, a in w.items()
    }, metadata={"format": "np"})


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed")


# --------------------------------------------------------------------------- formats agree
def test_combine_matches_bitfold_digest_of_the_mapping():
    w = _weights()
    assert combine({n: bitfold.digest(a) for n, a in w.items()}) == bitfold.digest(w)
    assert combine({}) == bitfold.digest({})


def test_npz_and_safetensors_give_bitfold_digest(tmp_path):
    w = _weights()
    np.savez(tmp_path / "w.npz", **w)
    np.savez_compressed(tmp_path / "wc.npz", **w)
    _st_from_numpy(tmp_path / "w.safetensors", w)
    expected = bitfold.digest(w)
    for name in ("w.npz", "wc.npz", "w.safetensors"):
        assert checkpoint_digest(tmp_path / name) == expected, name


def test_safetensors_library_file(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")
    w = _weights()
    st.save_file(w, str(tmp_path / "lib.safetensors"))
    assert checkpoint_digest(tmp_path / "lib.safetensors") == bitfold.digest(w)


def test_torch_state_dicts_give_the_same_digest(tmp_path, torch):
    w = _weights()
    sd = {n: torch.from_numpy(a.copy()) for n, a in w.items()}
    torch.save(sd, tmp_path / "zip.pt")
    torch.save(sd, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    # nested, with a non-contiguous tensor and an entry that is not a tensor
    nested = {"fc1": {"weight": sd["fc1.weight"].t().contiguous().t(), "bias": sd["fc1.bias"]},
              "fc2": {"weight": sd["fc2.weight"]}, "epoch": 3}
    nested.update({n: t for n, t in sd.items() if not n.startswith(("fc1", "fc2"))})
    assert not nested["fc1"]["weight"].is_contiguous()
    torch.save(nested, tmp_path / "nested.pt")
    expected = bitfold.digest(w)
    for name in ("zip.pt", "legacy.pt", "nested.pt"):
        assert checkpoint_digest(tmp_path / name) == expected, name
    info = read_checkpoint(tmp_path / "nested.pt")
    assert info.format == "torch" and info.ignored == ["epoch"]
    np.savez(tmp_path / "w.npz", **w)
    assert checkpoint_digest(tmp_path / "w.npz") == checkpoint_digest(tmp_path / "zip.pt")


def test_bfloat16_safetensors_and_torch_agree(tmp_path, torch):
    gen = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(5, 3, generator=gen).to(torch.bfloat16),
          "b": torch.tensor([-0.0, 0.0, float("nan"), 1.0], dtype=torch.bfloat16),
          "s": torch.randn(2, generator=gen)}
    torch.save(sd, tmp_path / "bf.pt")
    write_safetensors(tmp_path / "bf.safetensors", {
        "w": ("BF16", (5, 3), sd["w"].view(torch.int16).numpy().astype("<i2").tobytes()),
        "b": ("BF16", (4,), sd["b"].view(torch.int16).numpy().astype("<i2").tobytes()),
        "s": ("F32", (2,), sd["s"].numpy().astype("<f4").tobytes()),
    })
    expected = bitfold.digest(sd)
    assert checkpoint_digest(tmp_path / "bf.pt") == expected
    assert checkpoint_digest(tmp_path / "bf.safetensors") == expected
    # widening to float32 changes the digest: bfloat16 is kept as bfloat16
    assert expected != bitfold.digest({n: t.float() for n, t in sd.items()})
    _, per = checkpoint_digest(tmp_path / "bf.safetensors", per_tensor=True)
    assert per == {n: bitfold.digest(t) for n, t in sd.items()}


def test_bfloat16_from_safetensors_library(tmp_path, torch):
    st = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    sd = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16) / 7}
    st.save_file(sd, str(tmp_path / "bf.safetensors"))
    assert checkpoint_digest(tmp_path / "bf.safetensors") == bitfold.digest(sd)


def test_single_array_files(tmp_path, torch):
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 3
    np.save(tmp_path / "a.npy", a)
    torch.save(torch.from_numpy(a.copy()), tmp_path / "a.pt")
    assert checkpoint_digest(tmp_path / "a.npy") == bitfold.digest(a)
    assert checkpoint_digest(tmp_path / "a.pt") == bitfold.digest(a)
    assert checkpoint_digest(tmp_path / "a.npy", per_tensor=True) == (
        bitfold.digest(a), {"": bitfold.digest(a)})


def test_any_change_changes_the_digest(tmp_path):
    w = _weights()
    np.savez(tmp_path / "a.npz", **w)
    w2 = dict(w)
    w2["fc1.weight"] = w["fc1.weight"].copy()
    w2["fc1.weight"].view(np.uint32)[0, 0] ^= 1  # one bit
    np.savez(tmp_path / "b.npz", **w2)
    w3 = {("FC1.weight" if n == "fc1.weight" else n): a for n, a in w.items()}  # one name
    np.savez(tmp_path / "c.npz", **w3)
    digests = {checkpoint_digest(tmp_path / f) for f in ("a.npz", "b.npz", "c.npz")}
    assert len(digests) == 3


def test_per_tensor_lists_each_tensor_in_file_order(tmp_path):
    w = _weights()
    _st_from_numpy(tmp_path / "w.safetensors", w)
    total, per = checkpoint_digest(tmp_path / "w.safetensors", per_tensor=True)
    assert total == bitfold.digest(w)
    assert list(per) == list(w)
    assert per == {n: bitfold.digest(a) for n, a in w.items()}
    info = read_checkpoint(tmp_path / "w.safetensors")
    assert [(e.dtype, e.shape) for e in info.tensors] == [
        (str(a.dtype), list(a.shape)) for a in w.values()]


# --------------------------------------------------------------------------- refusals
class _Trap:
    """Unpickling this would create a file: the tests check that it never happens."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (Path(self.target),))


def test_random_bytes_are_refused(tmp_path):
    p = tmp_path / "noise.bin"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(FoldError, match=r"noise\.bin: not a checkpoint"):
        read_checkpoint(p)


def test_plain_pickle_is_refused_without_unpickling(tmp_path):
    armed = tmp_path / "armed"
    pickle.loads(pickle.dumps(_Trap(str(armed))))  # the trap works when unpickled
    assert armed.exists()
    target = tmp_path / "pwned"
    p = tmp_path / "model.pkl"
    p.write_bytes(pickle.dumps({"w": _Trap(str(target))}))
    with pytest.raises(FoldError, match=r"model\.pkl: refused: a Python pickle"):
        read_checkpoint(p)
    assert not target.exists()


def test_torch_file_with_arbitrary_objects_is_refused(tmp_path, torch):
    target = tmp_path / "pwned"
    p = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2), "trap": _Trap(str(target))}, p)
    with pytest.raises(FoldError, match=r"model\.pt: refused: loading it with weights_only=True "
                       r"failed \(Unsupported global"):
        read_checkpoint(p)
    assert not target.exists()


def test_npy_with_objects_is_refused(tmp_path):
    p = tmp_path / "obj.npy"
    np.save(p, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(FoldError, match=r"obj\.npy: refused: .*Python objects.*unpickling"):
        read_checkpoint(p)
    q = tmp_path / "obj.npz"
    np.savez(q, w=np.ones(2), o=np.array([1, "x"], dtype=object))
    with pytest.raises(FoldError, match=r"obj\.npz: refused: array 'o' holds Python objects"):
        read_checkpoint(q)


def test_truncated_safetensors_is_refused(tmp_path):
    good = _st_from_numpy(tmp_path / "w.safetensors", _weights()).read_bytes()
    cut_data = tmp_path / "cut.safetensors"
    cut_data.write_bytes(good[:-7])
    with pytest.raises(FoldError, match=r"cut\.safetensors: truncated safetensors file: tensor"):
        read_checkpoint(cut_data)
    cut_header = tmp_path / "cuth.safetensors"
    cut_header.write_bytes(good[:40])
    with pytest.raises(FoldError, match=r"cuth\.safetensors: truncated safetensors file: the "
                       r"header is \d+ bytes"):
        read_checkpoint(cut_header)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]},
         r"safetensors dtype 'F8_E4M3'; bitfold digests BOOL, U8"),
        ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]},
         r"data_offsets \[0, 8\], which do not hold 3 elements"),
        ({"dtype": "F32", "shape": "3", "data_offsets": [0, 12]}, r"bad safetensors header entry"),
    ],
)
def test_bad_safetensors_headers_are_refused(tmp_path, entry, match):
    h = json.dumps({"x": entry}).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + bytes(16))
    with pytest.raises(FoldError, match=match):
        read_checkpoint(p)


def test_other_refusals(tmp_path):
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(FoldError, match="empty file"):
        read_checkpoint(tmp_path / "empty.npz")
    with pytest.raises(FoldError, match="is a directory"):
        read_checkpoint(tmp_path)
    with pytest.raises(FoldError, match="cannot read"):
        read_checkpoint(tmp_path / "missing.safetensors")
    import zipfile

    with zipfile.ZipFile(tmp_path / "docs.zip", "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(FoldError, match=r"a zip archive but not a NumPy \.npz"):
        read_checkpoint(tmp_path / "docs.zip")
    good = tmp_path / "w.npz"
    np.savez(good, w=np.ones(1000))
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:300])
    with pytest.raises(FoldError, match=r"cut\.npz: damaged or truncated"):
        read_checkpoint(tmp_path / "cut.npz")


def test_torch_file_without_tensors_is_refused(tmp_path, torch):
    torch.save({"epoch": 3, "lr": 0.1}, tmp_path / "meta.pt")
    with pytest.raises(FoldError, match=r"meta\.pt: a PyTorch file that holds no tensors"):
        read_checkpoint(tmp_path / "meta.pt")


# --------------------------------------------------------------------------- CLI
def test_cli_prints_digests_and_exits_zero(tmp_path, capsys):
    w = _weights()
    np.savez(tmp_path / "w.npz", **w)
    _st_from_numpy(tmp_path / "w.safetensors", w)
    assert cli.main(["digest", str(tmp_path / "w.npz"), str(tmp_path / "w.safetensors")]) == 0
    lines = capsys.readouterr().out.splitlines()
    d = bitfold.digest(w)
    assert lines == [f"{d}  {tmp_path / 'w.npz'}", f"{d}  {tmp_path / 'w.safetensors'}"]


def test_cli_per_tensor(tmp_path, capsys):
    w = {"a": np.ones((2, 3), np.float32), "b": np.arange(4)}
    np.savez(tmp_path / "w.npz", **w)
    assert cli.main(["digest", "--per-tensor", str(tmp_path / "w.npz")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{bitfold.digest(w)}  {tmp_path / 'w.npz'}  (npz, 2 tensors)"
    assert out[1:] == [f"  {bitfold.digest(w['a'])}  a  float32[2,3]",
                       f"  {bitfold.digest(w['b'])}  b  int64[4]"]


def test_cli_json(tmp_path, capsys):
    w = {"a": np.ones((2, 3), np.float32)}
    np.savez(tmp_path / "w.npz", **w)
    assert cli.main(["digest", "--json", str(tmp_path / "w.npz")]) == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert (r["format"], r["digest"], r["tensors"]) == ("npz", bitfold.digest(w), 1)
    assert cli.main(["digest", "--json", "--per-tensor", str(tmp_path / "w.npz")]) == 0
    (r,) = json.loads(capsys.readouterr().out)
    assert r["tensors"] == [{"name": "a", "dtype": "float32", "shape": [2, 3],
                             "digest": bitfold.digest(w["a"])}]


def test_cli_refusal_exits_two_and_still_digests_the_rest(tmp_path, capsys):
    np.savez(tmp_path / "w.npz", w=np.ones(3))
    (tmp_path / "junk.bin").write_bytes(b"hello, world, not weights")
    rc = cli.main(["digest", str(tmp_path / "junk.bin"), str(tmp_path / "w.npz")])
    assert rc == 2
    captured = capsys.readouterr()
    assert "junk.bin: not a checkpoint" in captured.err
    assert captured.out == f"{bitfold.digest({'w': np.ones(3)})}  {tmp_path / 'w.npz'}\n"
    assert cli.main(["digest", "--json", str(tmp_path / "junk.bin")]) == 2
    (r,) = json.loads(capsys.readouterr().out)
    assert "not a checkpoint" in r["error"]


def test_non_torch_files_do_not_import_torch(tmp_path):
    np.savez(tmp_path / "w.npz", w=np.ones(3))
    code = (
        "import sys; from bitfold import cli; "
        f"rc = cli.main(['digest', {str(tmp_path / 'w.npz')!r}]); "
        "assert 'torch' not in sys.modules; sys.exit(rc)"
    )
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("sha256:")


def test_digest_model_prints_the_digest_train_reports(tmp_path, capsys):
    """A training checkpoint: --model digests the state dict (as train does), plain the file."""
    import torch

    from bitfold import cli

    model = torch.nn.Linear(3, 2)
    sd = model.state_dict()
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": sd, "optimizer": {"state": {}, "lr": torch.tensor(0.1)},
                "digest": bitfold.digest(sd)}, path)  # fmt: skip
    assert cli.main(["digest", "--model", str(path)]) == 0
    line = capsys.readouterr().out.strip()
    assert line == f"{bitfold.digest(sd)}  {path}  (model)"
    assert cli.main(["digest", str(path)]) == 0
    whole = capsys.readouterr().out.split()[0]
    assert whole != bitfold.digest(sd)
    torch.save({"weights": sd}, tmp_path / "other.pt")
    assert cli.main(["digest", "--model", str(tmp_path / "other.pt")]) == 2
    assert "not a checkpoint of `bitfold train --save`" in capsys.readouterr().err


def _train_checkpoint(torch, path: Path) -> bytes:
    """A file shaped like ``bitfold train --save``'s, large enough to be cut inside its data."""
    model = {"w": torch.arange(20_000, dtype=torch.float32), "b": torch.ones(3)}
    torch.save({"format": "bitfold-train-checkpoint/1", "model": model, "step": 3}, path)
    return path.read_bytes()


@pytest.mark.parametrize("model", [True, False], ids=["--model", "every-tensor"])
@pytest.mark.parametrize("cut", [1000, 0.5, -10], ids=["head", "middle", "tail"])
def test_cli_names_a_truncated_pytorch_file_as_damaged_or_truncated(tmp_path, torch, capsys,
                                                                    model, cut):  # fmt: skip
    data = _train_checkpoint(torch, tmp_path / "good.pt")
    n = int(len(data) * cut) if isinstance(cut, float) else cut
    bad = tmp_path / "cut.pt"
    bad.write_bytes(data[:n])
    assert cli.main(["digest", *(["--model"] if model else []), str(bad)]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and err.startswith("bitfold digest: error: ")
    assert f"{bad}: damaged or truncated" in err
    assert "Errno" not in err and "miniz" not in err and "Traceback" not in captured.out + err


def test_cli_names_a_truncated_legacy_pytorch_file(tmp_path, torch, capsys):
    torch.save({"model": {"w": torch.ones(2000)}}, tmp_path / "old.pt",
               _use_new_zipfile_serialization=False)  # fmt: skip
    cut = tmp_path / "cut.pt"
    cut.write_bytes((tmp_path / "old.pt").read_bytes()[:4000])
    for flags in (["--model"], []):
        assert cli.main(["digest", *flags, str(cut)]) == 2
        err = capsys.readouterr().err
        assert f"{cut}: damaged or truncated PyTorch file" in err and "Traceback" not in err


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: p.write_bytes(b""), "empty file"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: None, "cannot read: No such file or directory"),
        (lambda p: p.write_bytes(_npy_bytes(np.ones(3))), "a NumPy .npy file, not a PyTorch file"),
        (lambda p: p.write_bytes(pickle.dumps({"a": 1})), "refused: a Python pickle"),
        (lambda p: p.write_text("hello, world\n"), "not a checkpoint"),
    ],
    ids=["empty", "directory", "missing", "npy", "pickle", "text"],
)
def test_cli_model_refuses_what_is_not_a_pytorch_file_naming_it(tmp_path, capsys, make, words):
    path = tmp_path / "thing.pt"
    make(path)
    assert cli.main(["digest", "--model", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bitfold digest: error: {path}") and words in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_json_refusals_are_on_stderr_too(tmp_path, capsys):
    (tmp_path / "junk.bin").write_bytes(b"hello, world, not weights")
    for flags in (["--json"], ["--json", "--model"]):
        assert cli.main(["digest", *flags, str(tmp_path / "junk.bin")]) == 2
        captured = capsys.readouterr()
        (r,) = json.loads(captured.out)
        assert "not a checkpoint" in r["error"]
        assert "junk.bin: not a checkpoint" in captured.err
