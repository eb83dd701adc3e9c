"""ModelConfig messages: declaring tensors from LPX's tensor table, and the config.pbtxt text. Every
config.pbtxt is a `ModelConfig` protobuf message printed with text_format, so no placeholder can be
left unfilled."""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import text_format

from ...runtime.tensors import Spec
from .proto import mc

HEADER = (
    "# Written by LPX (pipeline/stages/repository/): change lpx.yaml and rerun 'lpx repo', not this file.\n"
)


def declare(conf: mc.ModelConfig, inputs: Iterable[Spec], outputs: Iterable[Spec]) -> mc.ModelConfig:
    """Add the input and output tensors to `conf`, with upstream's reshape and ragged-batch settings."""
    for spec in inputs:
        tensor = conf.input.add(
            name=spec.name,
            data_type=mc.DataType.Value(spec.dtype),
            dims=spec.dims,
            optional=spec.optional,
            allow_ragged_batch=spec.ragged,
        )
        if spec.reshape is not None:
            tensor.reshape.SetInParent()
            tensor.reshape.shape.extend(spec.reshape)
    for spec in outputs:
        conf.output.add(name=spec.name, data_type=mc.DataType.Value(spec.dtype), dims=spec.dims)
    return conf


def text(conf: mc.ModelConfig) -> str:
    """The config.pbtxt body (without LPX's header line)."""
    return text_format.MessageToString(conf)
