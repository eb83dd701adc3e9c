"""Rebuild a quantized model from LPX's own ModelOpt state without initializing weights first.

`from_config` random-initializes every weight on the CPU (323.6 s of bare ModelOpt's 399.8 s at the
Llama-3.1-8B shape) only for `mto.restore` to overwrite all of them. Here the model is built on the
meta device (no memory, no init), given uninitialized storage on the target device with `to_empty`,
and filled by `mto.restore`. What the state dict does not hold is computed as the model's own
`__init__` computes it:
  - non-persistent buffers (RoPE `inv_freq` / `original_inv_freq`): with the rope function transformers'
    rotary module uses (the same one `PreTrainedModel._init_weights` re-runs after its own meta-device
    load in transformers 5.14), on the CPU as `from_config` does, then copied to the device;
  - tied weights: `tie_weights()` again, so the lm_head is the embedding, not a copy.
A module with a non-persistent buffer LPX does not know how to compute makes `empty_model` fall back to
`from_config` (slow but exact), saying so in the returned note.

The state file is a torch pickle: load only LPX's own artifacts this way.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path


def _rope_buffers(module):
    """(inv_freq) as the rotary module's __init__ computes it, or None when this is not such a module."""
    if "RotaryEmbedding" not in type(module).__name__ or not hasattr(module, "original_inv_freq"):
        return None
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = getattr(module, "rope_type", "default")
    fn = module.compute_default_rope_parameters if rope_type == "default" else ROPE_INIT_FUNCTIONS[rope_type]
    inv_freq, _ = fn(module.config, None)
    return inv_freq


def _non_persistent(model) -> dict:
    """module -> names of its non-persistent buffers."""
    out = {}
    for module in model.modules():
        names = [
            n
            for n in getattr(module, "_non_persistent_buffers_set", ())
            if getattr(module, n, None) is not None
        ]
        if names:
            out[module] = names
    return out


def empty_model(config, dtype, device: str) -> tuple[object, str]:
    """An uninitialized model on `device` whose non-persistent buffers and weight ties are right.
    Returns (model, how it was built)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    computed, unknown = {}, []
    for module, names in _non_persistent(model).items():
        try:  # a transformers version whose rotary module differs falls back rather than failing
            inv_freq = _rope_buffers(module)
        except (AttributeError, KeyError, TypeError) as exc:
            unknown.append(f"{type(module).__name__} ({exc})")
            continue
        if inv_freq is None or set(names) - {"inv_freq", "original_inv_freq"}:
            unknown += [f"{type(module).__name__}.{n}" for n in names]
        computed[module] = inv_freq
    if unknown:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)
        return model, f"from_config (random init): LPX cannot compute {', '.join(sorted(set(unknown)))}"
    model = model.to_empty(device=device)
    with torch.no_grad():
        for module, inv_freq in computed.items():
            module.inv_freq.copy_(inv_freq)
            module.original_inv_freq.copy_(inv_freq)
    model.tie_weights()
    return model, "meta device + to_empty (no weight init)"


def restore_state(config_dir: Path, state_file: Path, dtype, device: str) -> tuple[object, str]:
    """The quantized model from LPX's state folder: config from `config_dir`, ModelOpt state + weights
    from `state_file`, built on `device`. Returns (model in eval mode, how it was built)."""
    import modelopt.torch.opt as mto
    from transformers import AutoConfig

    model, how = empty_model(AutoConfig.from_pretrained(config_dir), dtype, device)
    with contextlib.redirect_stdout(io.StringIO()):  # ModelOpt prints one line per registered module
        mto.restore(model, str(state_file), map_location=device)
    return model.eval(), how
