"""Hyperparameters on disk: TensorBoard's HParams records, and ``hparams.yaml`` (written by hand)."""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any

from ._disk import naming


# The HParams tab (tensorboard 2.x) takes its columns from one "experiment" record, read from
# the first run that has one, else built from every run's "session start" (the values) and
# scalars: metrics then come in name order, so `epoch` and whatever sorts before a model's values
# take the 5 columns it ticks, and a scalar named like a hyperparameter (`lr`) is a second column of
# that name. Each run writes its record when its fit ends, as Lightning's logger writes one:
# its hyperparameters, and its metrics in the order below. (tensorboard's own summary helpers
# need TensorFlow: built here.)
def session_start(hparams: dict[str, bool | int | float | str]) -> Any:
    from tensorboard.plugins.hparams import plugin_data_pb2

    info = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, value in hparams.items():
        if isinstance(value, bool):  # before int: True is an int too
            info.hparams[name].bool_value = value
        elif isinstance(value, (int, float)):
            info.hparams[name].number_value = value
        else:
            info.hparams[name].string_value = value
    return _hparams_summary("session_start_info", plugin_data_pb2.HParamsPluginData(session_start_info=info))


def experiment(hparams: dict[str, bool | int | float | str], metrics: list[str]) -> Any:
    """The columns: ``hparams`` (TensorBoard orders them by name and ticks the first 5) and
    ``metrics`` in this order (it ticks the first 5). No domains: a domain would make the
    column's filter list only this run's value, and drop other runs' from the table."""
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    types = {bool: api_pb2.DATA_TYPE_BOOL, str: api_pb2.DATA_TYPE_STRING}
    record = api_pb2.Experiment(
        time_created_secs=time.time(),
        hparam_infos=[
            api_pb2.HParamInfo(name=k, type=types.get(type(v), api_pb2.DATA_TYPE_FLOAT64)) for k, v in hparams.items()
        ],
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in metrics],
    )
    return _hparams_summary("experiment", plugin_data_pb2.HParamsPluginData(experiment=record))


# What the Trainer adds to each logging step (trainer/loops/log_writer.py): `epoch`, as Lightning does.
_TRAINERS_OWN = ("epoch",)


def metric_columns(counts: dict[str, int], declared: list[str], hparams: dict[str, Any], prefix: str = "") -> list[str]:
    """The HParams tab's metric columns, most useful first. ``counts``: the points written per
    tag; ``declared``: the names given to ``log_hyperparams(params, metrics)``.

    1. the declared names (Lightning's way of choosing the tab's metrics);
    2. the values the model logged, those written least often first: validation and epoch
       means, which runs are compared by, before per-step values (one batch's loss), ties
       in name order;
    3. the Trainer's own (``epoch``) and the
       ``hp_metric=-1`` placeholder when nothing else was logged to it, by name.

    A name that is also a hyperparameter's is left out: its column would be a second ``lr``.
    """
    def own(tag: str) -> bool:
        name = tag[len(prefix) + 1:] if prefix and tag.startswith(f"{prefix}-") else tag
        placeholder = name == "hp_metric" and counts[tag] == 1  # TensorBoardLogger()'s -1, never logged since
        return placeholder or name.split("/", 1)[0] in _TRAINERS_OWN

    first = [tag for tag in dict.fromkeys(declared) if tag not in hparams]
    rest = [tag for tag in counts if tag not in hparams and tag not in first]
    logged = sorted((tag for tag in rest if not own(tag)), key=lambda tag: (counts[tag], tag))
    return first + logged + sorted(tag for tag in rest if own(tag))


def session_end_success() -> Any:
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    info = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    return _hparams_summary("session_end_info", plugin_data_pb2.HParamsPluginData(session_end_info=info))


def _hparams_summary(kind: str, data: Any) -> Any:
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata

    tag = {
        "experiment": metadata.EXPERIMENT_TAG,
        "session_start_info": metadata.SESSION_START_INFO_TAG,
        "session_end_info": metadata.SESSION_END_INFO_TAG,
    }[kind]
    value = Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR)
    return Summary(value=[value])


# --- hparams.yaml ------------------------------------------------------------------------
def write_yaml(path: str, params: dict[str, Any]) -> None:
    """``params`` as YAML (a temp file renamed into place) that ``yaml.safe_load`` reads back as
    the same data: strings double-quoted with YAML's escapes, numbers, bools and None as YAML's,
    dicts and lists nested (a tuple as a list); any other object as its ``str``."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    text = "".join(_yaml_lines(params, 0)) if params else "{}\n"
    tmp = f"{path}.tmp{os.getpid()}"
    with naming(path, tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            key = _key(k)
            if _nested(v):
                lines.append(f"{pad}{key}:\n")
                lines += _yaml_lines(v, indent + 2)
            else:
                lines.append(f"{pad}{key}: {_scalar(v)}\n")
    else:  # a non-empty list or tuple
        for v in value:
            if _nested(v):
                lines.append(f"{pad}-\n")
                lines += _yaml_lines(v, indent + 2)
            else:
                lines.append(f"{pad}- {_scalar(v)}\n")
    return lines


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}


def _key(key: Any) -> str:
    """A name as is when YAML reads it back as that string, else quoted; an int, float, bool or
    None key (a nested dict's) as that scalar."""
    if not isinstance(key, str):
        return _scalar(key) if key is None or isinstance(key, (bool, int, float)) else _quoted(str(key))
    if _PLAIN_KEY.fullmatch(key) and key.lower() not in _YAML_WORDS:
        return key
    return _quoted(key)


# What YAML 1.1 lets stand in a double-quoted scalar: printable characters, less the line breaks
# it would fold (NEL, LS, PS) and the two the quotes escape. The rest is written as an escape:
# JSON's quoting leaves DEL and C1 controls raw, which makes PyYAML reject the whole file.
_RAW = re.compile(r"[^\x20-\x21\x23-\x5b\x5d-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _quoted(text: str) -> str:
    def escape(match: re.Match[str]) -> str:
        c = match.group()
        code = ord(c)
        return _ESCAPES.get(c) or (
            f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        )

    return '"' + _RAW.sub(escape, text) + '"'


def _nested(value: Any) -> bool:
    return isinstance(value, (dict, list, tuple)) and len(value) > 0


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        # YAML 1.1 reads a number as a float only with a dot: `1e-05` and `1e+20` are strings to it
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0{e}{exponent}" if e and "." not in mantissa else text
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, (list, tuple)):
        return "[]"
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:  # a one-element tensor
        return _scalar(value.item())
    return _quoted(str(value))
