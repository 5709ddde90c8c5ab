"""For ``mkdocs build`` only (mkdocs.yml loads it into mkdocstrings): the Trainer's signature
as its user calls it, on the API reference page.

- A default that is a named marker string (``log_dir``'s: a ``str`` subclass, so that the
  Trainer can tell "left at the default" from the same folder given) is shown as the string
  it is, not as the marker's name.
- ``**unknown`` catches the keywords the Trainer does not take, to refuse each with a sentence
  (the Trainer's docstring says so): it is no option, and is left out.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe

_SHOWN_AS_CALLED = {"trainer.trainer.Trainer.__init__": "unknown"}  # function -> its catch-all


class SignatureAsCalled(griffe.Extension):
    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        catch_all = _SHOWN_AS_CALLED.get(func.path)
        if catch_all is None:
            return
        module, cls, name = func.path.rsplit(".", 2)
        live = inspect.signature(getattr(getattr(importlib.import_module(module), cls), name)).parameters
        if catch_all in func.parameters:
            del func.parameters[catch_all]
        for param in func.parameters:
            default = live[param.name].default if param.name in live else None
            if isinstance(default, str) and type(default) is not str:
                param.default = repr(str(default))
