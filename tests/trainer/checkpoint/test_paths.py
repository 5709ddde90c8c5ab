"""trainer/checkpoint/paths.py: which file a ``ckpt_path`` names. "last" never leaves this run's
own folders; a URL's cached copy is keyed by the whole URL and checked before use."""

from __future__ import annotations

import http.server
import os
import threading

import pytest
import torch

from callbacks import ModelCheckpoint
from tests._models import Classifier, loader
from trainer import CheckpointError, Trainer


def _trainer(root, logger: bool, **kw) -> Trainer:
    return Trainer(default_root_dir=str(root), logger=logger, enable_progress_bar=False, enable_model_summary=False, **kw)


def _step(path) -> int:
    return torch.load(path, weights_only=True)["global_step"]


# --- "last" ------------------------------------------------------------------------------------
@pytest.mark.parametrize("logger", [True, False])
def test_last_with_a_named_dirpath_never_resumes_another_experiments_file(tmp_path, logger, trainer_log):
    # Two experiments in one default_root_dir, each with its own ModelCheckpoint(dirpath=...), as the docs advise.
    # 4 batches an epoch. A ends at step 8, in its folder "a".
    _trainer(tmp_path, logger, max_epochs=2, callbacks=[ModelCheckpoint(dirpath=tmp_path / "a")]).fit(Classifier(), loader(64))
    # B stops 1 batch into its second epoch: its resume point goes to the shared run folder, newer than A's file.
    _trainer(tmp_path, logger, max_steps=5, callbacks=[ModelCheckpoint(dirpath=tmp_path / "b")]).fit(Classifier(), loader(64))
    shared = tmp_path / ("lightning_logs/version_1/checkpoints" if logger else "checkpoints") / "last.ckpt"
    assert _step(shared) == 5  # B's, the newest checkpoint under default_root_dir

    again = _trainer(tmp_path, logger, max_epochs=3, callbacks=[ModelCheckpoint(dirpath=tmp_path / "a")])
    again.fit(Classifier(), loader(64), ckpt_path="last")
    own = str(tmp_path / "a" / "epoch=1-step=8.ckpt")
    assert again.ckpt_path == own and again.global_step == 12  # A's file (step 8) + one epoch, not B's step 5
    assert f"ckpt_path='last' is {own}: the newest intact checkpoint in {tmp_path / 'a'} (and the stop point {shared})." in trainer_log
    assert f"ckpt_path='last': not {shared}, another experiment's stop point (its ModelCheckpoint wrote elsewhere)." in trainer_log


def test_last_for_test_looks_only_in_the_named_folder_too(tmp_path):
    _trainer(tmp_path, False, max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path / "a", save_last=True)]).fit(
        Classifier(), loader(64))
    _trainer(tmp_path, False, max_steps=5, callbacks=[ModelCheckpoint(dirpath=tmp_path / "b")]).fit(Classifier(), loader(64))
    evaluating = _trainer(tmp_path, False, callbacks=[ModelCheckpoint(dirpath=tmp_path / "a")])
    evaluating.test(Classifier(), loader(16), ckpt_path="last")
    assert evaluating.ckpt_path == str(tmp_path / "a" / "last.ckpt")


# --- URLs --------------------------------------------------------------------------------------
class _Server:
    """A real HTTP server on 127.0.0.1: ``files`` maps a URL path to its bytes; a path in
    ``cut`` announces its whole length and closes the connection halfway through the body."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.cut: set[str] = set()
        self.requests = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if self.path in server.cut else body)
                self.close_connection = True

            def log_message(self, *args) -> None:  # quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    served = _Server()
    yield served
    served.httpd.shutdown()
    served.httpd.server_close()


def _cache(tmp_path) -> list[str]:
    folder = tmp_path / "torch_home" / "hub" / "checkpoints"
    return sorted(os.listdir(folder)) if folder.exists() else []


def _checkpoint(tmp_path, steps: int) -> bytes:
    trainer = _trainer(tmp_path, False, max_steps=steps, enable_checkpointing=False)
    trainer.fit(Classifier(), loader(64))
    trainer.save_checkpoint(tmp_path / f"step{steps}.ckpt")
    return (tmp_path / f"step{steps}.ckpt").read_bytes()


def test_two_urls_of_one_file_name_are_two_cache_entries(tmp_path, server):
    server.files = {"/a/last.ckpt": _checkpoint(tmp_path, 2), "/b/last.ckpt": _checkpoint(tmp_path, 4)}
    for name, step in (("a", 2), ("b", 4), ("a", 2)):
        resumed = _trainer(tmp_path, False, max_steps=6, enable_checkpointing=False)
        resumed.fit(Classifier(), loader(64), ckpt_path=f"{server.url}/{name}/last.ckpt")
        assert _step(resumed.ckpt_path) == step  # each URL's own state
    assert len(_cache(tmp_path)) == 2 and server.requests == 2  # the third run read the cached copy


def test_a_cut_off_download_leaves_no_entry_and_the_retry_works_once_the_server_is_fixed(tmp_path, server):
    server.files["/model.ckpt"] = _checkpoint(tmp_path, 2)
    server.cut.add("/model.ckpt")
    url = f"{server.url}/model.ckpt"
    with pytest.raises(CheckpointError, match=rf"^Could not download ckpt_path='{url}': the connection closed after \d+ bytes"):
        _trainer(tmp_path, False, max_steps=4, enable_checkpointing=False).fit(Classifier(), loader(64), ckpt_path=url)
    assert _cache(tmp_path) == []  # no entry, no temp file
    server.cut.clear()
    fixed = _trainer(tmp_path, False, max_steps=4, enable_checkpointing=False)
    fixed.fit(Classifier(), loader(64), ckpt_path=url)
    assert _step(fixed.ckpt_path) == 2 and fixed.global_step == 4


def test_a_404_names_the_url_and_caches_nothing(tmp_path, server):
    url = f"{server.url}/missing/last.ckpt"
    with pytest.raises(FileNotFoundError, match=rf"^Could not download ckpt_path='{url}': the server answered HTTP 404"):
        _trainer(tmp_path, False).validate(Classifier(), loader(16), ckpt_path=url)
    assert _cache(tmp_path) == []


def test_a_url_that_serves_no_checkpoint_is_refused_before_it_is_cached(tmp_path, server):
    server.files["/page.ckpt"] = b"<html>Sign in to download</html>"
    url = f"{server.url}/page.ckpt"
    with pytest.raises(CheckpointError, match=rf"^The download of ckpt_path='{url}' is not a whole checkpoint"):
        _trainer(tmp_path, False).validate(Classifier(), loader(16), ckpt_path=url)
    assert _cache(tmp_path) == []


def test_a_damaged_cache_entry_is_downloaded_again(tmp_path, server, trainer_log):
    server.files["/model.ckpt"] = _checkpoint(tmp_path, 2)
    url = f"{server.url}/model.ckpt"
    _trainer(tmp_path, False).validate(Classifier(), loader(16), ckpt_path=url)
    (entry,) = _cache(tmp_path)
    path = tmp_path / "torch_home" / "hub" / "checkpoints" / entry
    path.write_bytes(path.read_bytes()[:-100])  # cut short on disk
    again = _trainer(tmp_path, False)
    again.validate(Classifier(), loader(16), ckpt_path=url)
    assert server.requests == 2 and again.ckpt_path == str(path) and path.read_bytes() == server.files["/model.ckpt"]
    assert any(line.startswith(f"ckpt_path='{url}': the cached copy {path} is damaged") for line in trainer_log)


def test_load_from_checkpoint_reads_a_url_through_the_same_cache(tmp_path, server):
    server.files["/model.ckpt"] = _checkpoint(tmp_path, 2)
    model = Classifier.load_from_checkpoint(f"{server.url}/model.ckpt")
    saved = torch.load(tmp_path / "step2.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items()) and len(_cache(tmp_path)) == 1


# --- under DDP: rank 0 decides, every rank gets the same file or the same error ---------------------
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_under_ddp_a_failed_download_ends_the_job_naming_the_url_and_a_good_one_loads_on_every_rank(tmp_path, server):
    url = f"{server.url}/missing.ckpt"
    # Every rank raises rank 0's error (none waits for a file that will not come); the launcher reports the first.
    with pytest.raises(Exception, match=rf"MissingCheckpoint: Could not download ckpt_path='{url}': the server answered HTTP 404"):
        _trainer(tmp_path, False, strategy="ddp", devices=2).validate(Classifier(), loader(16), ckpt_path=url)
    server.files["/model.ckpt"] = _checkpoint(tmp_path, 2)
    model = Classifier()
    done = _trainer(tmp_path, False, strategy="ddp", devices=2)
    done.validate(model, loader(16), ckpt_path=f"{server.url}/model.ckpt")
    saved = torch.load(tmp_path / "step2.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert server.requests == 2 and len(_cache(tmp_path)) == 1  # one download for both ranks (and the 404)
