"""trainer/core/signals.py: a SIGTERM during fit stops at the next step boundary, and a handler installed before runs too."""

from __future__ import annotations

import os
import signal

import pytest

from callbacks import Callback
from tests._models import Classifier, loader, quiet
from trainer import Interrupted, Trainer


def test_a_sigterm_handler_installed_before_fit_runs_too_and_is_put_back_after(tmp_path):
    received = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        class Term(Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                if batch_idx == 0:
                    os.kill(os.getpid(), signal.SIGTERM)

        trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, enable_progress_bar=False, logger=False,
                          callbacks=[Term()])
        with pytest.raises(Interrupted, match="SIGTERM"):
            trainer.fit(Classifier(), loader(64))
        assert received == [signal.SIGTERM]  # Lightning's: the user's handler is called as well
        assert trainer.received_sigterm and os.listdir(tmp_path)  # and the stop still saved where it was
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler) and handler is not signal.SIG_DFL
        handler(signal.SIGTERM, None)  # the user's own handler is back
        assert received == [signal.SIGTERM] * 2
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_without_a_handler_before_a_sigterm_only_stops_fit():
    class Term(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted, match="SIGTERM"):
        Trainer(max_epochs=1, **quiet(callbacks=[Term()])).fit(Classifier(), loader(64))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
