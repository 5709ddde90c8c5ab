"""trainer.checkpoint.serialize writes the very bytes torch.save writes, faster for plain tensors."""

from __future__ import annotations

import collections
import io
import os
import threading
import zipfile

import pytest
import torch

from tests._models import Classifier, loader
from trainer import Trainer
from trainer.checkpoint import integrity, serialize


def torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def our_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    serialize.save(obj, buffer)
    return buffer.getvalue()


def many_kinds_of_tensor() -> dict:
    base = torch.arange(24, dtype=torch.float32)
    hooked = torch.ones(2, requires_grad=True)
    hooked.register_hook(lambda grad: grad)
    tagged = torch.zeros(3)
    tagged.note = "an attribute"  # pickled with its __dict__, the usual way
    return {
        "plain": torch.randn(3, 4),
        "view with an offset": base[3:9].view(2, 3),
        "transposed": base.view(4, 6).t(),
        "the base of both": base,
        "int64": torch.arange(5),
        "bool": torch.tensor([True, False]),
        "bfloat16": torch.randn(4).bfloat16(),
        "scalar": torch.tensor(3.0),
        "empty": torch.empty(0),
        "requires_grad": torch.randn(2).requires_grad_(),
        "negative bit": torch.randn(3)._neg_view(),
        "conjugate bit": torch.randn(3, dtype=torch.complex64).conj(),
        "uint16 (rebuilt with v3)": torch.zeros(4, dtype=torch.uint16),
        "sparse": torch.eye(3).to_sparse(),
        "parameter": torch.nn.Parameter(torch.ones(2)),
        "hooked": hooked,
        "with an attribute": tagged,
        "containers": [1, 2.5, "x", None, (torch.ones(2), {"k": torch.zeros(1)})],
        "ordered": collections.OrderedDict(w=torch.ones(1)),
        "a storage of its own": torch.arange(4.0).untyped_storage(),
    }


def test_every_kind_of_tensor_gives_the_bytes_torch_save_gives():
    obj = many_kinds_of_tensor()
    with pytest.warns(UserWarning, match="will not be serialized"):  # torch's own warning, for the hooked tensor
        expected = torch_bytes(obj)
    with pytest.warns(UserWarning, match="will not be serialized"):
        assert our_bytes(obj) == expected


def test_without_torchs_archive_pieces_it_is_torch_save_with_the_short_tensor_path(monkeypatch):
    obj = many_kinds_of_tensor()
    del obj["hooked"]
    monkeypatch.setattr(serialize, "_OWN_ARCHIVE", False)
    calls = []
    monkeypatch.setattr(serialize._Pickler, "persistent_id", lambda self, o: calls.append(o))  # torch's replaces it
    assert our_bytes(obj) == torch_bytes(obj) and calls == []


def test_loaded_tensors_keep_their_views_strides_and_hooks_of_their_own():
    obj = many_kinds_of_tensor()
    del obj["hooked"], obj["with an attribute"], obj["parameter"], obj["sparse"]  # not weights_only loadable
    loaded = torch.load(io.BytesIO(our_bytes(obj)), weights_only=True)
    for name, value in obj.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(loaded[name].resolve_neg().resolve_conj(), value.resolve_neg().resolve_conj()), name
            assert loaded[name].stride() == value.stride() and loaded[name].dtype == value.dtype, name
    view, base = loaded["view with an offset"], loaded["the base of both"]
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr() and view.storage_offset() == 3
    assert loaded["plain"]._backward_hooks is not loaded["int64"]._backward_hooks  # not one dict shared by all


def test_plain_tensors_take_the_short_path_and_the_others_the_usual_one():
    pickler = serialize._Pickler(io.BytesIO())
    assert pickler.reducer_override(torch.ones(2, 2).t()) is not NotImplemented
    for other in (torch.nn.Parameter(torch.ones(1)), torch.eye(2).to_sparse(), torch.zeros(2, dtype=torch.uint16), "text", 3):
        assert pickler.reducer_override(other) is NotImplemented



def test_empty_ordered_dicts_shared_storages_and_every_dtype_give_torch_saves_bytes_and_its_error():
    named = collections.OrderedDict()
    named.note = "kept"  # an attribute: pickled with its state, the usual way
    base = torch.arange(8, dtype=torch.float64)
    obj = {"hooks": collections.OrderedDict(), "named": named, "size": torch.Size([2]), "dtype": torch.float16,
           "same storage": [base, base[2:], base.view(2, 4)], "device": torch.device("cpu"),
           **{str(d): torch.ones(3, dtype=d) for d in (torch.float16, torch.int8, torch.uint8, torch.complex128)}}
    for _ in range(2):  # the second time, every type and dtype is known
        assert our_bytes(obj) == torch_bytes(obj)
    with pytest.raises(RuntimeError, match="view the same data as different types") as ours:
        our_bytes([base, base.view(torch.int64)])
    with pytest.raises(RuntimeError, match="view the same data as different types") as theirs:
        torch_bytes([base, base.view(torch.int64)])
    assert str(ours.value) == str(theirs.value)

def test_a_fits_checkpoint_file_is_what_torch_save_writes(tmp_path):
    torch.manual_seed(0)
    model = Classifier(optimizer="adam")
    trainer = Trainer(max_epochs=2, log_dir=str(tmp_path), enable_progress_bar=False, logger=False)
    trainer.fit(model, loader())
    path = trainer.checkpoint_callback.best_model_path
    with open(path, "rb") as f:
        written = f.read()
    checkpoint = torch.load(path, weights_only=True)
    assert written == torch_bytes(checkpoint)  # the background writer's bytes, through serialize.save
    assert os.path.basename(path) == "epoch=1-step=16.ckpt"
    assert torch.equal(checkpoint["state_dict"]["net.0.weight"], model.net[0].weight.detach())


def test_a_replaced_torch_save_is_called_for_every_checkpoint_as_in_lightning(monkeypatch):
    calls = []
    real = torch.save

    def counting(obj, f, *args, **kwargs):
        calls.append(obj["global_step"])
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", counting)
    trainer = Trainer(max_epochs=2, enable_progress_bar=False, logger=False)
    trainer.fit(Classifier(), loader())
    assert calls == [8, 16]  # the two epoch-end checkpoints, through the replacement
    assert torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)["global_step"] == 16


# --- the CRC-32s of a big checkpoint, filled in by zlib ---------------------------------------
def big_state() -> dict:
    """Tensors of 1 MiB and more, so that ``save`` fills in the CRCs itself, beside small ones."""
    torch.manual_seed(0)
    return {"state_dict": {"w": torch.randn(512, 1024), "b": torch.randn(1024)}, "moments": [torch.randn(300_000)],
            "global_step": 7, "names": ["a", "b"]}


@pytest.fixture
def torch_crcs_off():
    """What a user may set for torch.save: our files must hold the CRCs all the same (our load checks them)."""
    from torch.utils.serialization import config

    before, config.save.compute_crc32 = config.save.compute_crc32, False
    yield config
    config.save.compute_crc32 = before


def test_a_big_checkpoint_is_torch_saves_bytes_with_the_crcs_our_filler_computed(torch_crcs_off):
    obj = big_state()
    torch_crcs_off.save.compute_crc32 = True
    expected = torch_bytes(obj)
    torch_crcs_off.save.compute_crc32 = False  # now torch's writer would leave every CRC 0: these are the filler's
    assert serialize._worth_filling({str(i): t.untyped_storage() for i, t in enumerate((obj["state_dict"]["w"],))})
    written = our_bytes(obj)
    assert written == expected
    assert zipfile.ZipFile(io.BytesIO(written)).testzip() is None  # every CRC checked by Python's zipfile
    loaded = torch.load(io.BytesIO(written), weights_only=True)
    assert torch.equal(loaded["state_dict"]["w"], obj["state_dict"]["w"]) and loaded["global_step"] == 7
    assert torch_bytes(obj) != expected  # (the user's setting is left as it was: torch.save still writes no CRCs)


def test_a_small_checkpoint_holds_its_crcs_too_whatever_torchs_setting(torch_crcs_off):
    obj = {"w": torch.ones(3), "step": 1}
    assert zipfile.ZipFile(io.BytesIO(our_bytes(obj))).testzip() is None
    assert zipfile.ZipFile(io.BytesIO(torch_bytes(obj))).testzip() is not None  # torch.save's, with the setting


def test_every_kind_of_tensor_and_records_that_look_like_zip_descriptors_give_torch_saves_bytes(monkeypatch):
    monkeypatch.setattr(serialize, "FILL_MIN_RECORD_BYTES", 0)  # the filler for every checkpoint
    descriptor_like = b"PK\x07\x08\x01\x02\x03\x04" + bytes(8)  # torch folds such data into its serialization id
    obj = many_kinds_of_tensor()
    del obj["hooked"]
    obj.update({
        "like a descriptor": torch.frombuffer(bytearray(descriptor_like), dtype=torch.uint8),
        "like an empty descriptor": torch.frombuffer(bytearray(descriptor_like[:4] + bytes(12)), dtype=torch.uint8),
        "big": torch.randn(10_000),
    })
    for state in (obj, {}, {"empty": torch.empty(0)}):
        written = our_bytes(state)
        assert written == torch_bytes(state)
        assert zipfile.ZipFile(io.BytesIO(written)).testzip() is None


def test_a_zip_layout_the_filler_does_not_know_is_written_again_with_torchs_crcs(monkeypatch, torch_crcs_off):
    obj = big_state()
    torch_crcs_off.save.compute_crc32 = True
    expected = torch_bytes(obj)
    torch_crcs_off.save.compute_crc32 = False
    monkeypatch.setattr(serialize, "_LOCAL", b"PK\x03\x05")  # as if a later torch wrote other local headers
    buffer = io.BytesIO()
    buffer.write(b"before")
    serialize.save(obj, buffer)
    assert buffer.getvalue() == b"before" + expected  # what the filler let through is gone; what was there stays


def test_a_save_on_another_thread_leaves_torch_saves_on_this_one_with_their_crcs(tmp_path):
    errors: list = []

    def save_big() -> None:
        try:
            for i in range(3):
                with open(tmp_path / f"big{i}.pt", "wb") as f:
                    serialize.save(big_state(), f)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    thread = threading.Thread(target=save_big)
    thread.start()
    small = []
    while thread.is_alive() or not small:
        small.append(torch_bytes({"w": torch.randn(2000)}))
    thread.join()
    assert not errors
    assert all(zipfile.ZipFile(io.BytesIO(b)).testzip() is None for b in small)
    for i in range(3):
        assert integrity.damage(tmp_path / f"big{i}.pt") is None
